// Package cnidriver drives CNI plugins through the real runtime library
// (libcni), the way containerd and cnitool do. Tests and the lab run it
// inside a node's network namespace (`twillctl cni run`), so the plugins it
// executes wire pods into that node, never into the caller's namespace.
package cnidriver

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/types"
)

// Request is one batch of CNI operations against one network.
type Request struct {
	// Op is add, check, del, gc or status.
	Op       string          `json:"op"`
	ConfList json.RawMessage `json:"confList"`
	BinDirs  []string        `json:"binDirs"`
	CacheDir string          `json:"cacheDir"`
	// Attachments are the pods to act on (add, check, del).
	Attachments []Attachment `json:"attachments,omitempty"`
	// Parallel runs the attachments' operations concurrently.
	Parallel bool `json:"parallel,omitempty"`
	// Valid lists the attachments GC must keep.
	Valid []types.GCAttachment `json:"valid,omitempty"`
}

// Attachment is one pod interface.
type Attachment struct {
	ContainerID string `json:"containerID"`
	IfName      string `json:"ifName"`
	Netns       string `json:"netns"`
}

// Outcome is what one operation returned.
type Outcome struct {
	Result json.RawMessage `json:"result,omitempty"`
	Error  string          `json:"error,omitempty"`
	// Took is the operation's wall time in nanoseconds.
	Took time.Duration `json:"took"`
}

// Response holds one Outcome per attachment (or one for gc and status).
type Response struct {
	Outcomes []Outcome `json:"outcomes"`
}

// Run carries out req.
func Run(ctx context.Context, req Request) (Response, error) {
	list, err := libcni.ConfListFromBytes(req.ConfList)
	if err != nil {
		return Response{}, fmt.Errorf("parsing conflist: %w", err)
	}
	cni := libcni.NewCNIConfigWithCacheDir(req.BinDirs, req.CacheDir, nil)
	one := func(f func() (types.Result, error)) Outcome {
		start := time.Now()
		res, err := f()
		o := Outcome{Took: time.Since(start)}
		if err != nil {
			o.Error = err.Error()
		}
		if res != nil {
			if b, merr := json.Marshal(res); merr == nil {
				o.Result = b
			}
		}
		return o
	}
	switch req.Op {
	case "gc":
		return Response{Outcomes: []Outcome{one(func() (types.Result, error) {
			return nil, cni.GCNetworkList(ctx, list, &libcni.GCArgs{ValidAttachments: req.Valid})
		})}}, nil
	case "status":
		return Response{Outcomes: []Outcome{one(func() (types.Result, error) {
			return nil, cni.GetStatusNetworkList(ctx, list)
		})}}, nil
	case "add", "check", "del":
	default:
		return Response{}, fmt.Errorf("op %q: want add, check, del, gc or status", req.Op)
	}
	out := make([]Outcome, len(req.Attachments))
	do := func(i int) {
		a := req.Attachments[i]
		rt := &libcni.RuntimeConf{ContainerID: a.ContainerID, NetNS: a.Netns, IfName: a.IfName}
		out[i] = one(func() (types.Result, error) {
			switch req.Op {
			case "add":
				return cni.AddNetworkList(ctx, list, rt)
			case "check":
				return nil, cni.CheckNetworkList(ctx, list, rt)
			default:
				return nil, cni.DelNetworkList(ctx, list, rt)
			}
		})
	}
	if !req.Parallel {
		for i := range req.Attachments {
			do(i)
		}
		return Response{Outcomes: out}, nil
	}
	var wg sync.WaitGroup
	for i := range req.Attachments {
		wg.Add(1)
		go func() {
			defer wg.Done()
			do(i)
		}()
	}
	wg.Wait()
	return Response{Outcomes: out}, nil
}
