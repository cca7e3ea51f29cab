package lab

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/twill-net/twill/lab/cluster"
)

// startNodeRoot starts `twillctl lab node-root` for node n in a new mount
// namespace and in the node's network namespace, its files under dir and
// the machine's paths keep still visible, waits until its mounts are in
// place, and returns its PID.
func (s *State) startNodeRoot(ctx context.Context, n Node, dir string, keep ...string) (int, error) {
	ready := filepath.Join(dir, "root.ready")
	argv := []string{"nsenter", "--net=/var/run/netns/" + n.NS, filepath.Join(s.BinDir, "twill-lab"), "lab", "node-root", "--dir", dir, "--ready-file", ready,
		"--hostname", n.Name}
	for _, k := range keep {
		argv = append(argv, "--keep", k)
	}
	// CLONE_NEWNS: the child gets its own mount namespace, and Go makes
	// its root mount private before exec, so nothing mounted in it
	// propagates back to the machine. CLONE_NEWUTS: its own host name, the
	// Node's, for kubelet, containerd and hostNetwork pods.
	pid, err := s.start("node-root", n.NS, argv, &syscall.SysProcAttr{Setsid: true, Unshareflags: syscall.CLONE_NEWNS | syscall.CLONE_NEWUTS})
	if err != nil {
		return 0, err
	}
	return pid, cluster.Poll(ctx, 30*time.Second, n.Name+"'s root", func() error {
		_, err := os.Stat(ready)
		return s.processError(err, "node-root")
	})
}

// spawnInNode starts a node process in the node's network namespace and
// in its root's mount and UTS namespaces. nsenter rather than `ip netns exec`,
// which mounts a fresh /sys without the cgroup hierarchies runc needs.
func (s *State) spawnInNode(role, nsName string, rootPID int, bin string, args ...string) error {
	argv := append([]string{"nsenter", "-t", strconv.Itoa(rootPID), "-m", "-u", "--net=/var/run/netns/" + nsName, bin}, args...)
	_, err := s.start(role, nsName, argv, &syscall.SysProcAttr{Setsid: true})
	return err
}

// rootPID is the PID of a node's root process.
func (s *State) rootPID(nsName string) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, p := range s.Processes {
		if p.Role == "node-root" && p.NS == nsName && alive(p.PID) {
			return p.PID, nil
		}
	}
	return 0, fmt.Errorf("node %s has no running root process (lab down, then up again)", nsName)
}

// NodePath is path on a node as its own processes see it (in its root's
// mount namespace), reachable from the machine: a file to read, a unix
// socket to connect to.
func (s *State) NodePath(node, path string) (string, error) {
	for _, n := range s.Nodes {
		if n.Name == node {
			pid, err := s.rootPID(n.NS)
			if err != nil {
				return "", err
			}
			return fmt.Sprintf("/proc/%d/root%s", pid, path), nil
		}
	}
	return "", fmt.Errorf("no node %q in the lab", node)
}

// NodeExec runs a command on a node as its own processes see it: in its
// network namespace and its root's mount and UTS namespaces.
func (s *State) NodeExec(ctx context.Context, node string, stdin io.Reader, name string, args ...string) (string, error) {
	c, err := s.nodeCommand(node, append([]string{name}, args...))
	if err != nil {
		return "", err
	}
	cmd := exec.CommandContext(ctx, c.Path, c.Args[1:]...)
	cmd.Stdin = stdin
	out, err := cmd.CombinedOutput()
	return string(out), err
}

func (s *State) nodeCommand(node string, argv []string) (*exec.Cmd, error) {
	nsName := ""
	for _, n := range s.Nodes {
		if n.Name == node || n.NS == node {
			nsName = n.NS
		}
	}
	if nsName == "" {
		return nil, fmt.Errorf("no node %q in lab %q", node, s.Name)
	}
	pid, err := s.rootPID(nsName)
	if err != nil {
		return nil, err
	}
	args := []string{"-t", strconv.Itoa(pid), "-m", "-u", "--net=/var/run/netns/" + nsName}
	if wd, err := os.Getwd(); err == nil {
		args = append(args, "--wd="+wd) // the caller's directory, as for any command
	}
	return exec.Command("nsenter", append(args, argv...)...), nil
}

// ExecCommand is a command run inside a lab node or pod: in a Kubernetes
// lab's node, in its mount namespace too, as kubelet sees the node; in a
// Kubernetes pod, in the pod's network namespace.
func ExecCommand(s *State, target string, argv []string) (*exec.Cmd, error) {
	argv = s.ownCommand(target, argv)
	if s.Bare {
		return s.nodeCommand(target, argv)
	}
	if s.Kubernetes {
		for _, n := range s.Nodes {
			if n.Name == target || n.NS == target {
				return s.nodeCommand(target, argv)
			}
		}
		if err := s.refreshPods(context.Background()); err != nil {
			return nil, err
		}
		for _, p := range s.Pods {
			if p.Name == target || p.Label() == target {
				nsPath, err := PodNetNS(s, p)
				if err != nil {
					return nil, err
				}
				return exec.Command("nsenter", append([]string{"--net=" + nsPath}, argv...)...), nil
			}
		}
	}
	ns, ok := s.Find(target)
	if !ok {
		return nil, fmt.Errorf("no node or pod %q in lab %q", target, s.Name)
	}
	return exec.Command("ip", append([]string{"netns", "exec", ns}, argv...)...), nil
}

// KubectlCommand is kubectl as the lab's admin, run in the underlay
// namespace (where the apiserver listens).
func (s *State) KubectlCommand(args ...string) *exec.Cmd {
	full := append([]string{"netns", "exec", s.prefix() + "-ul", filepath.Join(s.KubeBinDir, "kubectl"), "--kubeconfig", s.AdminKubeconfig}, args...)
	return exec.Command("ip", full...)
}

// Kubectl runs kubectl as the lab's admin and returns its output.
func (s *State) Kubectl(ctx context.Context, stdin io.Reader, args ...string) (string, error) {
	cctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	c := s.KubectlCommand(args...)
	cmd := exec.CommandContext(cctx, c.Path, c.Args[1:]...)
	cmd.Stdin = stdin
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return string(out) + stderr.String(), err
	}
	return string(out), nil
}

// UnderlayNS is the network namespace holding the lab's bridge and its
// control plane: the apiserver is reached from there.
func (s *State) UnderlayNS() string { return s.prefix() + "-ul" }

// ownCommand makes twill's own commands work inside a lab node as written in
// the docs: twilld, twillctl and twill are the lab's binaries, and twillctl
// status, leases and config are given the node's paths and the lab's etcd
// (or kubeconfig) unless the command names them itself.
func (s *State) ownCommand(target string, argv []string) []string {
	if len(argv) == 0 {
		return argv
	}
	switch argv[0] {
	case "twilld":
		argv = append([]string{filepath.Join(s.BinDir, DaemonBinary(s.Backend))}, argv[1:]...)
	case "twillctl", "twill":
		argv = append([]string{filepath.Join(s.BinDir, argv[0])}, argv[1:]...)
	default:
		return argv
	}
	if filepath.Base(argv[0]) != "twillctl" || len(argv) < 2 {
		return argv
	}
	has := func(flag string) bool {
		for _, a := range argv {
			if a == flag || strings.HasPrefix(a, flag+"=") {
				return true
			}
		}
		return false
	}
	add := func(flag, value string) {
		if !has(flag) {
			argv = append(argv, flag, value)
		}
	}
	node := ""
	for _, n := range s.Nodes {
		if n.Name == target || n.NS == target {
			node = n.Name
		}
	}
	switch argv[1] {
	case "status":
		if s.Kubernetes || node == "" {
			return argv
		}
		add("--etcd-endpoints", s.EtcdURL)
		add("--subnet-file", filepath.Join(s.Dir, node, "subnet.env"))
		add("--state-dir", filepath.Join(s.Dir, node))
		add("--iface", "eth0")
	case "leases":
		if s.Kubernetes {
			add("--kubeconfig", s.AdminKubeconfig)
		} else {
			add("--etcd-endpoints", s.EtcdURL)
		}
	case "config":
		if !s.Kubernetes {
			add("--etcd-endpoints", s.EtcdURL)
		}
	case "policy":
		// explain reads the apiserver; log reads this node's twilld, or
		// with --pod or --node, that pod's or node's through the apiserver.
		switch {
		case !s.Kubernetes || len(argv) < 3:
		case argv[2] == "log" && !has("--pod") && !has("--node") && !has("--kubeconfig"):
			add("--endpoint", fmt.Sprintf("http://127.0.0.1:%d", HealthzPort))
		default:
			add("--kubeconfig", s.AdminKubeconfig)
		}
	}
	return argv
}

// apiGet reads an apiserver path as the lab's admin, connecting from the
// underlay namespace (nothing listens in, or is sent to, the machine's).
func (s *State) apiGet(ctx context.Context, path string) ([]byte, error) {
	cert, err := tls.LoadX509KeyPair(filepath.Join(s.Dir, "pki", "admin.crt"), filepath.Join(s.Dir, "pki", "admin.key"))
	if err != nil {
		return nil, err
	}
	caPEM, err := os.ReadFile(s.CAFile)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(caPEM)
	underlay := "/var/run/netns/" + s.prefix() + "-ul"
	dialer := &net.Dialer{Timeout: 5 * time.Second}
	tr := &http.Transport{
		TLSClientConfig: &tls.Config{Certificates: []tls.Certificate{cert}, RootCAs: pool},
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			var c net.Conn
			err := ns.WithNetNSPath(underlay, func(ns.NetNS) error {
				var err error
				c, err = dialer.DialContext(ctx, network, addr)
				return err
			})
			return c, err
		},
	}
	defer tr.CloseIdleConnections()
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(cctx, http.MethodGet, s.APIServer+path, nil)
	if err != nil {
		return nil, err
	}
	resp, err := (&http.Client{Transport: tr}).Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return body, fmt.Errorf("GET %s: %s: %s", path, resp.Status, strings.TrimSpace(string(body)))
	}
	return body, nil
}

// apiJSON decodes an apiserver path into v.
func (s *State) apiJSON(ctx context.Context, path string, v any) error {
	body, err := s.apiGet(ctx, path)
	if err != nil {
		return err
	}
	return json.Unmarshal(body, v)
}
