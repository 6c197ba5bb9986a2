// SPDX-License-Identifier: GPL-3.0-or-later

// cri-status: a minimal CRI client (runtime.v1). It calls RuntimeService.Status with verbose=true
// on -endpoint and prints one JSON object: the runtime conditions, the runtime handlers the runtime
// reports (StatusResponse.runtime_handlers, filled by containerd 2.x) and the verbose info map with
// its JSON values decoded (containerd puts its effective CRI config under "config", including
// containerd.runtimes for both 1.7 and 2.x). Built by build-containerd.sh inside the containerd 2.x
// wrapper module, so it uses the k8s.io/cri-api and grpc versions containerd pins.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

type condition struct {
	Type    string `json:"type"`
	Status  bool   `json:"status"`
	Reason  string `json:"reason,omitempty"`
	Message string `json:"message,omitempty"`
}

type output struct {
	Conditions      []condition                `json:"conditions"`
	RuntimeHandlers []string                   `json:"runtimeHandlers"`
	Info            map[string]json.RawMessage `json:"info"`
}

func main() {
	endpoint := flag.String("endpoint", "", "CRI socket (unix:///path or /path)")
	timeout := flag.Duration("timeout", 10*time.Second, "overall timeout")
	flag.Parse()
	if *endpoint == "" {
		fmt.Fprintln(os.Stderr, "cri-status: -endpoint is required")
		os.Exit(2)
	}
	target := *endpoint
	if !strings.HasPrefix(target, "unix://") {
		target = "unix://" + target
	}
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	conn, err := grpc.NewClient(target, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		fmt.Fprintf(os.Stderr, "cri-status: %v\n", err)
		os.Exit(1)
	}
	defer conn.Close()
	resp, err := runtimeapi.NewRuntimeServiceClient(conn).Status(ctx, &runtimeapi.StatusRequest{Verbose: true}, grpc.WaitForReady(true))
	if err != nil {
		fmt.Fprintf(os.Stderr, "cri-status: Status: %v\n", err)
		os.Exit(1)
	}
	out := output{Conditions: []condition{}, RuntimeHandlers: []string{}, Info: map[string]json.RawMessage{}}
	for _, c := range resp.GetStatus().GetConditions() {
		out.Conditions = append(out.Conditions, condition{c.GetType(), c.GetStatus(), c.GetReason(), c.GetMessage()})
	}
	for _, h := range resp.GetRuntimeHandlers() {
		out.RuntimeHandlers = append(out.RuntimeHandlers, h.GetName())
	}
	for k, v := range resp.GetInfo() {
		if json.Valid([]byte(v)) {
			out.Info[k] = json.RawMessage(v)
		} else {
			b, _ := json.Marshal(v)
			out.Info[k] = b
		}
	}
	b, err := json.Marshal(out)
	if err != nil {
		fmt.Fprintf(os.Stderr, "cri-status: %v\n", err)
		os.Exit(1)
	}
	fmt.Println(string(b))
}
