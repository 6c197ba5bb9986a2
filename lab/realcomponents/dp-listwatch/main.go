// SPDX-License-Identifier: GPL-3.0-or-later

// dp-listwatch: a minimal kubelet-side client of the device-plugin API (v1beta1).
// For every plugin socket in -dir (or each -socket) it calls GetDevicePluginOptions and
// ListAndWatch and prints one JSON line per ListAndWatch response; with -watch it keeps
// reading updates (health changes) for that long; with -allocate it asks each plugin to
// Allocate its first device and prints the container response's environment.
// With -kubelet it first plays the kubelet's Registration service on <dir>/kubelet.sock (for plugins
// that cannot skip registration, e.g. v0.15.x): every registered endpoint is queried as above, and
// it exits once no plugin has registered for -quiet (or after -kubelet in all).
// Built by build-device-plugin.sh inside the plugin's wrapper module, so it uses the same
// k8s.io/kubelet and grpc versions as the plugin it talks to.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

type device struct {
	ID     string  `json:"id"`
	Health string  `json:"health"`
	NUMA   []int64 `json:"numa,omitempty"`
}

type line struct {
	Socket   string            `json:"socket"`
	Event    string            `json:"event"` // options | list | allocate | error
	Devices  []device          `json:"devices,omitempty"`
	Envs     map[string]string `json:"envs,omitempty"`
	Mounts   []string          `json:"mounts,omitempty"`
	Specs    []string          `json:"device_specs,omitempty"`
	IDs      []string          `json:"ids,omitempty"`
	Options  map[string]bool   `json:"options,omitempty"`
	Resource string            `json:"resource,omitempty"`
	Error    string            `json:"error,omitempty"`
	Elapsed  float64           `json:"elapsed_s"`
	Sequence int               `json:"seq"`
}

type stringList []string

func (s *stringList) String() string     { return strings.Join(*s, ",") }
func (s *stringList) Set(v string) error { *s = append(*s, v); return nil }

var (
	outMu sync.Mutex
	start = time.Now()
)

func emit(l line) {
	outMu.Lock()
	defer outMu.Unlock()
	l.Elapsed = time.Since(start).Seconds()
	b, _ := json.Marshal(l)
	fmt.Println(string(b))
}

func main() {
	dir := flag.String("dir", pluginapi.DevicePluginPath, "directory holding the plugins' sockets")
	var sockets stringList
	flag.Var(&sockets, "socket", "plugin socket (repeatable); default: every *.sock in -dir except kubelet.sock")
	timeout := flag.Duration("timeout", 5*time.Second, "dial and first-response timeout per socket")
	watch := flag.Duration("watch", 0, "keep reading ListAndWatch updates this long after the first list")
	allocate := flag.Bool("allocate", false, "Allocate the first device of each plugin and print its envs")
	preferred := flag.Int("preferred", 0, "ask each plugin for its preferred allocation of this many of its devices")
	kubelet := flag.Duration("kubelet", 0, "serve kubelet registration on <dir>/kubelet.sock for at most this long")
	quiet := flag.Duration("quiet", time.Second, "with -kubelet: stop this long after the last registration")
	flag.Parse()

	if *kubelet > 0 {
		os.Exit(serveKubelet(*dir, *kubelet, *quiet, func(sock string) error {
			return query(sock, *timeout, *watch, *allocate, *preferred)
		}))
	}

	if len(sockets) == 0 {
		matches, _ := filepath.Glob(filepath.Join(*dir, "*.sock"))
		for _, m := range matches {
			if filepath.Base(m) != "kubelet.sock" {
				sockets = append(sockets, m)
			}
		}
	}
	sort.Strings(sockets)
	if len(sockets) == 0 {
		fmt.Fprintf(os.Stderr, "dp-listwatch: no plugin sockets in %s\n", *dir)
		os.Exit(3)
	}

	var wg sync.WaitGroup
	failed := false
	var failMu sync.Mutex
	for _, s := range sockets {
		wg.Add(1)
		go func(sock string) {
			defer wg.Done()
			if err := query(sock, *timeout, *watch, *allocate, *preferred); err != nil {
				emit(line{Socket: filepath.Base(sock), Event: "error", Error: err.Error()})
				failMu.Lock()
				failed = true
				failMu.Unlock()
			}
		}(s)
	}
	wg.Wait()
	if failed {
		os.Exit(1)
	}
}

func query(sock string, timeout, watch time.Duration, allocate bool, preferred int) error {
	name := filepath.Base(sock)
	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return fmt.Errorf("dial: %w", err)
	}
	defer conn.Close()
	client := pluginapi.NewDevicePluginClient(conn)

	octx, ocancel := context.WithTimeout(context.Background(), timeout)
	opts, err := client.GetDevicePluginOptions(octx, &pluginapi.Empty{}, grpc.WaitForReady(true))
	ocancel()
	if err != nil {
		return fmt.Errorf("GetDevicePluginOptions: %w", err)
	}
	emit(line{Socket: name, Event: "options", Options: map[string]bool{
		"pre_start_required":                 opts.PreStartRequired,
		"get_preferred_allocation_available": opts.GetPreferredAllocationAvailable,
	}})

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stream, err := client.ListAndWatch(ctx, &pluginapi.Empty{})
	if err != nil {
		return fmt.Errorf("ListAndWatch: %w", err)
	}
	type recv struct {
		resp *pluginapi.ListAndWatchResponse
		err  error
	}
	ch := make(chan recv, 16)
	go func() {
		for {
			r, err := stream.Recv()
			ch <- recv{r, err}
			if err != nil {
				return
			}
		}
	}()

	var first *pluginapi.ListAndWatchResponse
	select {
	case r := <-ch:
		if r.err != nil {
			return fmt.Errorf("ListAndWatch recv: %w", r.err)
		}
		first = r.resp
	case <-time.After(timeout):
		return fmt.Errorf("ListAndWatch: no response within %s", timeout)
	}
	emit(line{Socket: name, Event: "list", Devices: devices(first), Sequence: 0})

	if allocate && len(first.Devices) > 0 {
		actx, acancel := context.WithTimeout(context.Background(), timeout)
		resp, err := client.Allocate(actx, &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{
			{DevicesIDs: []string{first.Devices[0].ID}},
		}})
		acancel()
		if err != nil {
			emit(line{Socket: name, Event: "allocate", Error: err.Error()})
		} else if len(resp.ContainerResponses) > 0 {
			cr := resp.ContainerResponses[0]
			l := line{Socket: name, Event: "allocate", Envs: cr.Envs, IDs: []string{first.Devices[0].ID}}
			for _, m := range cr.Mounts {
				l.Mounts = append(l.Mounts, m.HostPath+":"+m.ContainerPath)
			}
			for _, d := range cr.Devices {
				l.Specs = append(l.Specs, d.HostPath+":"+d.ContainerPath+":"+d.Permissions)
			}
			emit(l)
		}
	}

	if preferred > 0 && opts.GetPreferredAllocationAvailable {
		var ids []string
		for _, d := range first.Devices {
			ids = append(ids, d.ID)
		}
		pctx, pcancel := context.WithTimeout(context.Background(), timeout)
		resp, err := client.GetPreferredAllocation(pctx, &pluginapi.PreferredAllocationRequest{
			ContainerRequests: []*pluginapi.ContainerPreferredAllocationRequest{
				{AvailableDeviceIDs: ids, AllocationSize: int32(preferred)},
			}})
		pcancel()
		if err != nil {
			emit(line{Socket: name, Event: "preferred", Error: err.Error()})
		} else if len(resp.ContainerResponses) > 0 {
			emit(line{Socket: name, Event: "preferred", IDs: resp.ContainerResponses[0].DeviceIDs})
		}
	}

	deadline := time.After(watch)
	for seq := 1; watch > 0; seq++ {
		select {
		case r := <-ch:
			if r.err != nil {
				return fmt.Errorf("ListAndWatch recv: %w", r.err)
			}
			emit(line{Socket: name, Event: "list", Devices: devices(r.resp), Sequence: seq})
		case <-deadline:
			return nil
		}
	}
	return nil
}

func devices(r *pluginapi.ListAndWatchResponse) []device {
	out := make([]device, 0, len(r.Devices))
	for _, d := range r.Devices {
		dev := device{ID: d.ID, Health: d.Health}
		if d.Topology != nil {
			for _, n := range d.Topology.Nodes {
				dev.NUMA = append(dev.NUMA, n.ID)
			}
		}
		out = append(out, dev)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

type registration struct {
	pluginapi.UnimplementedRegistrationServer
	dir string
	ch  chan *pluginapi.RegisterRequest
}

func (r *registration) Register(_ context.Context, req *pluginapi.RegisterRequest) (*pluginapi.Empty, error) {
	r.ch <- req
	return &pluginapi.Empty{}, nil
}

// serveKubelet answers Register calls like the kubelet and queries each registered endpoint.
func serveKubelet(dir string, total, quiet time.Duration, q func(string) error) int {
	sockPath := filepath.Join(dir, "kubelet.sock")
	_ = os.Remove(sockPath)
	lis, err := net.Listen("unix", sockPath)
	if err != nil {
		fmt.Fprintf(os.Stderr, "dp-listwatch: %v\n", err)
		return 3
	}
	srv := grpc.NewServer()
	reg := &registration{dir: dir, ch: make(chan *pluginapi.RegisterRequest, 16)}
	pluginapi.RegisterRegistrationServer(srv, reg)
	go func() { _ = srv.Serve(lis) }()
	defer func() { srv.Stop(); _ = os.Remove(sockPath) }()

	var wg sync.WaitGroup
	rc := 0
	var rcMu sync.Mutex
	end := time.After(total)
	var idle <-chan time.Time
	for {
		select {
		case req := <-reg.ch:
			emit(line{Socket: req.Endpoint, Event: "register", Resource: req.ResourceName})
			idle = time.After(quiet)
			wg.Add(1)
			go func(endpoint string) {
				defer wg.Done()
				if err := q(filepath.Join(dir, endpoint)); err != nil {
					emit(line{Socket: endpoint, Event: "error", Error: err.Error()})
					rcMu.Lock()
					rc = 1
					rcMu.Unlock()
				}
			}(req.Endpoint)
		case <-idle:
			wg.Wait()
			return rc
		case <-end:
			wg.Wait()
			return rc
		}
	}
}
