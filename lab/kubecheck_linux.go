package lab

import (
	"context"
	"fmt"
	"io/fs"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
)

// checkKube probes, over TCP: every pod from every pod and from every node
// (node -> pod), the echo Service's ClusterIP from everywhere (kube-proxy),
// and the hostPort pod through its node's address (twill's host ports);
// in a dual-stack lab each of them in both families.
func checkKube(ctx context.Context, s *State, binDir string) (Result, error) {
	if err := s.refreshPods(ctx); err != nil {
		return Result{}, err
	}
	var from []Vantage
	var to []Target
	for _, p := range s.Pods {
		nsPath, err := PodNetNS(s, p)
		if err != nil {
			return Result{}, err
		}
		from = append(from, Vantage{Name: p.Label(), NetNS: nsPath})
		for i, a := range p.Addrs() {
			name := p.Label()
			if i > 0 {
				name += "-v6" // a dual-stack pod's second address
			}
			to = append(to, Target{Name: name, Addr: netip.AddrPortFrom(a, EchoPort)})
		}
	}
	for _, n := range s.Nodes {
		from = append(from, Vantage{Name: n.Name, NetNS: "/var/run/netns/" + n.NS})
	}
	svc, err := s.echoServiceTargets(ctx)
	if err != nil {
		return Result{}, err
	}
	to = append(to, svc...)
	for _, p := range s.Pods {
		if !strings.HasPrefix(p.Name, "hostport") {
			continue
		}
		for _, n := range s.Nodes {
			if n.Name != p.Node {
				continue
			}
			for i, a := range n.nodeIPs() {
				name := "hostport"
				if i > 0 {
					name += "-v6"
				}
				to = append(to, Target{Name: name, Addr: netip.AddrPortFrom(a, HostPort)})
			}
		}
	}
	return Matrix(ctx, binDir, from, to), nil
}

// Label is how the matrix names a pod: its node and the distinct end of
// its name ("node1/x7k2p"; "node1/hostport").
func (p Pod) Label() string {
	if p.UID == "" {
		return p.Name
	}
	name := p.Name
	if strings.HasPrefix(name, "echo-") {
		name = name[strings.LastIndexByte(name, '-')+1:]
	}
	return p.Node + "/" + name
}

// PodNetNS finds a Kubernetes pod's network namespace: that of a process
// in the pod's cgroup (kubelet names it pod<UID> under the node's
// cgroupRoot).
func PodNetNS(s *State, p Pod) (string, error) {
	if p.UID == "" {
		return "/var/run/netns/" + p.NS, nil
	}
	want := "pod" + p.UID
	for _, root := range cgroupRoots(s.prefix()) {
		var found string
		_ = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
			if found != "" {
				return fs.SkipAll
			}
			if err != nil {
				return nil
			}
			if d.IsDir() && d.Name() == want {
				for _, pid := range cgroupPIDs([]string{path}) {
					// The sandbox's pause process and the containers share
					// the pod's namespace; any live one will do.
					if _, err := os.Stat(fmt.Sprintf("/proc/%d/ns/net", pid)); err == nil {
						found = fmt.Sprintf("/proc/%d/ns/net", pid)
						break
					}
				}
				return fs.SkipDir
			}
			return nil
		})
		if found != "" {
			return found, nil
		}
	}
	return "", fmt.Errorf("pod %s (uid %s): no process in its cgroup; is it running?", p.Name, p.UID)
}
