package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/twill-net/twill/lab"
)

// BenchmarkKubeLab measures the Kubernetes lab as an operator meets it:
// `lab up --kubernetes` with 2 nodes (binaries and images cached); a
// 20-replica Deployment applied until all its pods are Ready; and the pod
// sandbox time under containerd (crictl runp, then stopp and rmp) with twill
// wiring the pod, against the same with host networking, in the same run.
func BenchmarkKubeLab(b *testing.B) {
	for range b.N {
		benchKubeLab(b)
	}
}

func benchKubeLab(b *testing.B) {
	l := newLabCtl(b)
	images := labImages(b, l.bin, kubeImages, "bench")
	name := labName("kb")
	b.Cleanup(func() { _, _ = l.run("down", "--name", name) })
	start := time.Now()
	if out, err := l.run("up", "--name", name, "--kubernetes", "--nodes", "2", "--pods-per-node", "0",
		"--kube-bin-dir", kubeBinDir(b), "--image-dir", images); err != nil {
		b.Fatalf("lab up --kubernetes: %v\n%s", err, out)
	}
	up := time.Since(start)
	s, err := lab.Load(l.root, name)
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()

	// 20 replicas, spread by the scheduler, from apply to all Ready.
	deploy := fmt.Sprintf(`apiVersion: apps/v1
kind: Deployment
metadata: {name: scale, namespace: default}
spec:
  replicas: 20
  selector: {matchLabels: {app: scale}}
  template:
    metadata: {labels: {app: scale}}
    spec:
      automountServiceAccountToken: false
      terminationGracePeriodSeconds: 1
      containers:
        - name: echo
          image: %s
          command: ["/usr/local/bin/twill-lab", "lab", "echo-server", "--port", "%d"]
          readinessProbe: {tcpSocket: {port: %d}, periodSeconds: 1}
          resources: {requests: {cpu: 1m, memory: 8Mi}}
`, s.LabImage, lab.EchoPort, lab.EchoPort)
	t0 := time.Now()
	if out, err := s.Kubectl(ctx, strings.NewReader(deploy), "apply", "-f", "-"); err != nil {
		b.Fatalf("%v\n%s", err, out)
	}
	deadline := time.Now().Add(5 * time.Minute)
	for {
		out, err := s.Kubectl(ctx, nil, "get", "deploy", "scale", "-o", "jsonpath={.status.readyReplicas}")
		if err == nil && strings.TrimSpace(out) == "20" {
			break
		}
		if time.Now().After(deadline) {
			b.Fatalf("20 replicas not Ready after 5 minutes (%s)", out)
		}
		time.Sleep(100 * time.Millisecond)
	}
	ready := time.Since(t0)
	if out, err := s.Kubectl(ctx, nil, "delete", "deploy", "scale", "--wait=true"); err != nil {
		b.Fatalf("%v\n%s", err, out)
	}

	// Sandbox round trips on node1: twill's network, then the node's.
	twillUp, twillDown := sandboxTimes(b, s, false)
	hostUp, hostDown := sandboxTimes(b, s, true)
	ms := func(ds []time.Duration) float64 { return float64(median(ds).Microseconds()) / 1000 }
	b.ReportMetric(up.Seconds(), "lab-up-s")
	b.ReportMetric(ready.Seconds(), "deploy20-ready-s")
	b.ReportMetric(ms(twillUp), "runp-twill-p50-ms")
	b.ReportMetric(ms(hostUp), "runp-hostnet-p50-ms")
	b.ReportMetric(ms(twillDown), "stopp-rmp-twill-p50-ms")
	b.ReportMetric(ms(hostDown), "stopp-rmp-hostnet-p50-ms")
	b.Logf("lab up --kubernetes (2 nodes) %s; 20-replica Deployment Ready %s after apply; crictl runp p50: twill %.0f ms, host network %.0f ms; stopp+rmp p50: twill %.0f ms, host network %.0f ms",
		up.Round(100*time.Millisecond), ready.Round(100*time.Millisecond), ms(twillUp), ms(hostUp), ms(twillDown), ms(hostDown))
}

const sandboxSamples = 10

// sandboxTimes runs, stops and removes pod sandboxes on node1 with crictl,
// and returns how long each runp took, and each stopp+rmp.
func sandboxTimes(b *testing.B, s *lab.State, hostNetwork bool) (up, down []time.Duration) {
	b.Helper()
	node := s.Nodes[0]
	dir := filepath.Join(s.Dir, node.Name)
	cfg := "runtime-endpoint: unix:///run/containerd/containerd.sock\ntimeout: 60\n"
	if err := os.WriteFile(filepath.Join(dir, "crictl.yaml"), []byte(cfg), 0o644); err != nil {
		b.Fatal(err)
	}
	defer holdKubelet(b, s, 0)()
	network := 0 // POD
	if hostNetwork {
		network = 2 // NODE
	}
	for i := range sandboxSamples {
		path := filepath.Join(dir, fmt.Sprintf("bench-pod-%v-%d.json", hostNetwork, i))
		pod := fmt.Sprintf(`{"metadata": {"name": "bench-%d", "namespace": "bench", "uid": "bench-%v-%d", "attempt": 0},
  "linux": {"cgroup_parent": "/%s/bench", "security_context": {"namespace_options": {"network": %d}}}}`, i, hostNetwork, i, node.NS, network)
		if err := os.WriteFile(path, []byte(pod), 0o644); err != nil {
			b.Fatal(err)
		}
		crictl := func(args ...string) string {
			cmd, err := lab.ExecCommand(s, node.Name, append([]string{filepath.Join(s.KubeBinDir, "crictl"), "--config", filepath.Join(dir, "crictl.yaml")}, args...))
			if err != nil {
				b.Fatal(err)
			}
			out, err := cmd.Output()
			if err != nil {
				b.Fatalf("crictl %v: %v", args, err)
			}
			return strings.TrimSpace(string(out))
		}
		t0 := time.Now()
		id := crictl("runp", path)
		t1 := time.Now()
		crictl("stopp", id)
		crictl("rmp", id)
		up, down = append(up, t1.Sub(t0)), append(down, time.Since(t1))
	}
	return up, down
}
