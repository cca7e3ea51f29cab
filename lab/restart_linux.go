package lab

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/twill-net/twill/lab/cluster"
	etcdsm "github.com/twill-net/twill/subnet/etcd"
)

// Restartable are the roles lab restart stops and starts: the control
// plane's processes, which no DaemonSet or kubelet restarts.
var Restartable = []string{"etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler"}

// Restart stops the lab's process of role (SIGTERM, then SIGKILL after
// 30 s), starts it again as it was started, and waits until it serves
// again (the apiserver's /readyz, etcd's client port).
func (s *State) Restart(ctx context.Context, role string) error {
	if !slices.Contains(Restartable, role) {
		return fmt.Errorf("lab restart: role %q: want one of %s", role, strings.Join(Restartable, ", "))
	}
	s.mu.Lock()
	i := slices.IndexFunc(s.Processes, func(p Process) bool { return p.Role == role })
	var p Process
	if i >= 0 {
		p = s.Processes[i]
	}
	s.mu.Unlock()
	switch {
	case i < 0:
		return fmt.Errorf("lab restart: lab %s runs no %s", s.Name, role)
	case len(p.Argv) == 0:
		return fmt.Errorf("lab restart: lab %s was started by an older twillctl, which did not record how it started %s", s.Name, role)
	}
	if err := stopPID(p.PID, 30*time.Second); err != nil {
		return fmt.Errorf("lab restart: stopping %s (pid %d): %w", role, p.PID, err)
	}
	s.mu.Lock()
	s.Processes = slices.DeleteFunc(s.Processes, func(q Process) bool { return q.PID == p.PID })
	s.mu.Unlock()
	if _, err := s.start(role, p.NS, p.Argv, &syscall.SysProcAttr{Setsid: true}); err != nil {
		return fmt.Errorf("lab restart: %w", err)
	}
	return s.waitServing(ctx, role)
}

// RestartKubelet stops node's kubelet (continued first, if it was held
// with SIGSTOP) and starts it again as it was started, as when the node
// reboots: a kubelet whose Node was deleted registers it again only then.
func (s *State) RestartKubelet(node string) error {
	ns := ""
	for _, n := range s.Nodes {
		if n.Name == node {
			ns = n.NS
		}
	}
	s.mu.Lock()
	i := slices.IndexFunc(s.Processes, func(p Process) bool { return p.Role == "kubelet" && p.NS == ns })
	var p Process
	if i >= 0 {
		p = s.Processes[i]
	}
	s.mu.Unlock()
	if ns == "" || i < 0 || len(p.Argv) == 0 {
		return fmt.Errorf("lab %s: no kubelet recorded on node %q", s.Name, node)
	}
	_ = syscall.Kill(p.PID, syscall.SIGCONT)
	if err := stopPID(p.PID, 30*time.Second); err != nil {
		return fmt.Errorf("stopping %s's kubelet (pid %d): %w", node, p.PID, err)
	}
	s.mu.Lock()
	s.Processes = slices.DeleteFunc(s.Processes, func(q Process) bool { return q.PID == p.PID })
	s.mu.Unlock()
	if _, err := s.start("kubelet", ns, p.Argv, &syscall.SysProcAttr{Setsid: true}); err != nil {
		return fmt.Errorf("starting %s's kubelet again: %w", node, err)
	}
	return nil
}

// waitServing waits until a restarted control-plane process serves.
func (s *State) waitServing(ctx context.Context, role string) error {
	switch role {
	case "kube-apiserver":
		return cluster.Poll(ctx, 90*time.Second, "kube-apiserver to be ready", func() error {
			body, err := s.apiGet(ctx, "/readyz")
			if err == nil && strings.TrimSpace(string(body)) != "ok" {
				err = fmt.Errorf("/readyz: %s", body)
			}
			return s.processError(err, role)
		})
	case "etcd":
		cli, err := etcdsm.NewClient(etcdsm.ClientOptions{Endpoints: []string{"unix://" + s.EtcdSock}})
		if err != nil {
			return err
		}
		defer cli.Close()
		if err := cluster.Poll(ctx, 30*time.Second, "etcd to answer", func() error {
			cctx, cancel := context.WithTimeout(ctx, time.Second)
			defer cancel()
			_, err := cli.Get(cctx, "ping")
			return s.processError(err, role)
		}); err != nil || !s.Kubernetes {
			return err
		}
		// The apiserver is ready again once it reaches etcd.
		return s.waitServing(ctx, "kube-apiserver")
	}
	return nil
}

// stopPID sends SIGTERM to pid, then SIGKILL after grace, and waits until
// it is gone.
func stopPID(pid int, grace time.Duration) error {
	if err := syscall.Kill(pid, syscall.SIGTERM); err != nil {
		if errors.Is(err, syscall.ESRCH) {
			return nil
		}
		return err
	}
	if waitGone(pid, grace) {
		return nil
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
		return err
	}
	if waitGone(pid, 10*time.Second) {
		return nil
	}
	return fmt.Errorf("still running 10 s after SIGKILL")
}

// waitGone waits up to bound until pid has exited. A zombie (state Z) has:
// the process that started it, not this one, reaps it.
func waitGone(pid int, bound time.Duration) bool {
	for deadline := time.Now().Add(bound); ; time.Sleep(50 * time.Millisecond) {
		b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
		if err != nil || strings.Contains(string(b), ") Z ") {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
	}
}
