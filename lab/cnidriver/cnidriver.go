// Package cnidriver drives CNI plugins through the real runtime library
// (libcni), the way containerd and cnitool do. Tests and the lab run it
// inside a node's network namespace (`twillctl cni run`), so the plugins it
// executes wire pods into that node, never into the caller's namespace.
package cnidriver

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"sync"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/invoke"
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
	// CapabilityArgs are the runtime's values for the capabilities the
	// plugins declare (portMappings), as containerd passes them.
	CapabilityArgs map[string]any `json:"capabilityArgs,omitempty"`
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

// Failed counts the outcomes that are errors.
func (r Response) Failed() int {
	n := 0
	for _, o := range r.Outcomes {
		if o.Error != "" {
			n++
		}
	}
	return n
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
		rt := &libcni.RuntimeConf{ContainerID: a.ContainerID, NetNS: a.Netns, IfName: a.IfName, CapabilityArgs: a.CapabilityArgs}
		out[i] = one(func() (types.Result, error) {
			switch req.Op {
			case "add":
				return cni.AddNetworkList(ctx, list, rt)
			case "check":
				return nil, cni.CheckNetworkList(ctx, list, rt)
			default:
				return nil, del(ctx, cni, list, rt, req.BinDirs)
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

// del is DelNetworkList, except when a plugin of the chain is not installed:
// libcni stops at the first plugin it cannot find, so the plugins listed
// before it (twill's, whose DEL releases the pod's veth, route and address)
// never get their DEL. Then each installed plugin is run on its own, last
// to first, and the missing ones are reported.
func del(ctx context.Context, cni *libcni.CNIConfig, list *libcni.NetworkConfigList, rt *libcni.RuntimeConf, binDirs []string) error {
	err := cni.DelNetworkList(ctx, list, rt)
	if err == nil || !strings.Contains(err.Error(), "failed to find plugin") {
		return err
	}
	var errs []error
	for i := len(list.Plugins) - 1; i >= 0; i-- {
		p := list.Plugins[i]
		if _, ferr := invoke.FindInPath(p.Network.Type, binDirs); ferr != nil {
			errs = append(errs, fmt.Errorf("plugin %q is not installed (in %s): its DEL was skipped; install it",
				p.Network.Type, strings.Join(binDirs, ":")))
			continue
		}
		conf, cerr := pluginConf(list, p)
		if cerr != nil {
			errs = append(errs, cerr)
			continue
		}
		if derr := cni.DelNetwork(ctx, conf, rt); derr != nil {
			errs = append(errs, fmt.Errorf("plugin %q: %w", p.Network.Type, derr))
		}
	}
	return errors.Join(errs...)
}

// pluginConf is one plugin of a list as a single network configuration:
// the list's name and version added, as libcni gives each plugin.
func pluginConf(list *libcni.NetworkConfigList, p *libcni.NetworkConfig) (*libcni.NetworkConfig, error) {
	var m map[string]any
	if err := json.Unmarshal(p.Bytes, &m); err != nil {
		return nil, fmt.Errorf("plugin %q: %w", p.Network.Type, err)
	}
	m["name"], m["cniVersion"] = list.Name, list.CNIVersion
	b, err := json.Marshal(m)
	if err != nil {
		return nil, err
	}
	return libcni.ConfFromBytes(b)
}

// RunIn runs req with `twillctl cni run` (the twill-lab binary at labBin)
// inside network namespace ns (by name), as the lab and the tests drive
// the plugin. Outcomes that are errors are in the Response (the command
// then exits 2); an error is returned only when the request could not be
// carried out.
func RunIn(ctx context.Context, labBin, ns string, req Request) (Response, error) {
	body, err := json.Marshal(req)
	if err != nil {
		return Response{}, err
	}
	cmd := exec.CommandContext(ctx, "ip", "netns", "exec", ns, labBin, "cni", "run")
	cmd.Stdin = bytes.NewReader(body)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	var ee *exec.ExitError
	if err != nil && !(errors.As(err, &ee) && ee.ExitCode() == 2) {
		return Response{}, fmt.Errorf("twillctl cni run (%s) in %s: %w: %s", req.Op, ns, err, strings.TrimSpace(stderr.String()))
	}
	var resp Response
	if err := json.Unmarshal(out, &resp); err != nil {
		return Response{}, fmt.Errorf("twillctl cni run (%s) in %s: decoding %q: %w", req.Op, ns, out, err)
	}
	return resp, nil
}
