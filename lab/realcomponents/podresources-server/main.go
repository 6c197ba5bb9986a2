// SPDX-License-Identifier: GPL-3.0-or-later

// podresources-server serves the kubelet's REAL generated v1 PodResourcesLister gRPC service
// (k8s.io/kubelet/pkg/apis/podresources/v1, api_grpc.pb.go) on a unix socket, with canned answers
// read from JSON files (protojson of ListPodResourcesResponse / AllocatableResourcesResponse).
// It exists so tests/real can check gpuharden's stdlib-only gRPC client (plugins/module_utils/
// _podresources.py) against grpc-go's real HTTP/2 server, HPACK encoder and flow control.
//
// A method without a file answers Unimplemented through the generated
// UnimplementedPodResourcesListerServer, as a kubelet that lacks the method does.
//
// Usage: podresources-server -socket PATH [-list FILE] [-allocatable FILE]
// Prints "ready <socket>" on stdout once it listens; stops on SIGTERM/SIGINT.
package main

import (
	"context"
	"flag"
	"fmt"
	"net"
	"os"
	"os/signal"
	"syscall"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	podresourcesapi "k8s.io/kubelet/pkg/apis/podresources/v1"
)

type server struct {
	podresourcesapi.UnimplementedPodResourcesListerServer
	list        *podresourcesapi.ListPodResourcesResponse
	allocatable *podresourcesapi.AllocatableResourcesResponse
}

func (s *server) List(ctx context.Context, _ *podresourcesapi.ListPodResourcesRequest) (*podresourcesapi.ListPodResourcesResponse, error) {
	if s.list == nil {
		return s.UnimplementedPodResourcesListerServer.List(ctx, nil)
	}
	return s.list, nil
}

func (s *server) GetAllocatableResources(ctx context.Context, _ *podresourcesapi.AllocatableResourcesRequest) (*podresourcesapi.AllocatableResourcesResponse, error) {
	if s.allocatable == nil {
		return s.UnimplementedPodResourcesListerServer.GetAllocatableResources(ctx, nil)
	}
	return s.allocatable, nil
}

func load(path string, into proto.Message) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	return protojson.Unmarshal(data, into)
}

func main() {
	socket := flag.String("socket", "", "unix socket to listen on (removed first if it exists)")
	listFile := flag.String("list", "", "JSON ListPodResourcesResponse; empty: List answers Unimplemented")
	allocFile := flag.String("allocatable", "", "JSON AllocatableResourcesResponse; empty: GetAllocatableResources answers Unimplemented")
	flag.Parse()
	if *socket == "" {
		fmt.Fprintln(os.Stderr, "podresources-server: -socket is required")
		os.Exit(2)
	}
	s := &server{}
	if *listFile != "" {
		s.list = &podresourcesapi.ListPodResourcesResponse{}
		if err := load(*listFile, s.list); err != nil {
			fmt.Fprintf(os.Stderr, "podresources-server: %s: %v\n", *listFile, err)
			os.Exit(2)
		}
	}
	if *allocFile != "" {
		s.allocatable = &podresourcesapi.AllocatableResourcesResponse{}
		if err := load(*allocFile, s.allocatable); err != nil {
			fmt.Fprintf(os.Stderr, "podresources-server: %s: %v\n", *allocFile, err)
			os.Exit(2)
		}
	}
	_ = os.Remove(*socket)
	listener, err := net.Listen("unix", *socket)
	if err != nil {
		fmt.Fprintf(os.Stderr, "podresources-server: listen %s: %v\n", *socket, err)
		os.Exit(1)
	}
	// Default server options, as the kubelet's (pkg/kubelet/server/server.go ListenAndServePodResources
	// adds only a rate-limiting interceptor).
	grpcServer := grpc.NewServer()
	podresourcesapi.RegisterPodResourcesListerServer(grpcServer, s)
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	go func() {
		<-stop
		grpcServer.Stop()
	}()
	fmt.Printf("ready %s\n", *socket)
	if err := grpcServer.Serve(listener); err != nil {
		fmt.Fprintf(os.Stderr, "podresources-server: %v\n", err)
		os.Exit(1)
	}
}
