package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/twill-net/twill/lab"
)

// startKubeDisruption holds connections between every pod and every pod
// of another node, and the echo Service, in a Kubernetes lab.
func startKubeDisruption(t *testing.T, s *lab.State, bin, backend string) *disruption {
	t.Helper()
	from, to, pairs, err := lab.HoldPlan(context.Background(), s)
	if err != nil {
		t.Fatal(err)
	}
	return startDisruption(t, backend+", Kubernetes lab", bin, from, to, pairs)
}

// twillPodOn is the name of node's twill pod.
func twillPodOn(t *testing.T, s *lab.State, node string) string {
	t.Helper()
	for _, line := range strings.Split(labKubectl(t, s)("-n", lab.TwillNamespace, "get", "pods", "-l", "app.kubernetes.io/name=twill",
		"-o", `jsonpath={range .items[*]}{.metadata.name} {.spec.nodeName}{"\n"}{end}`), "\n") {
		if f := strings.Fields(line); len(f) == 2 && f[1] == node {
			return f[0]
		}
	}
	t.Fatalf("no twill pod on %s", node)
	return ""
}

// rollTwill rolls the DaemonSet to a new tag of the same image, and waits
// until every node runs it.
func rollTwill(t *testing.T, s *lab.State) {
	t.Helper()
	kubectl := labKubectl(t, s)
	cur := kubectl("-n", lab.TwillNamespace, "get", "ds/"+lab.TwillDaemonSet, "-o", "jsonpath={.spec.template.spec.containers[0].image}")
	newImage := s.TwillImage + "-next"
	if cur == newImage {
		newImage = s.TwillImage
	}
	for _, n := range s.Nodes {
		if out, err := s.NodeExec(context.Background(), n.Name, nil, "ctr", "-a", "/run/containerd/containerd.sock", "-n", "k8s.io",
			"images", "tag", "--force", s.TwillImage, newImage); err != nil && newImage != s.TwillImage {
			t.Fatalf("tagging %s on %s: %v\n%s", newImage, n.Name, err, out)
		}
	}
	kubectl("-n", lab.TwillNamespace, "set", "image", "ds/"+lab.TwillDaemonSet, "kube-twill="+newImage, "install-cni-plugin="+newImage)
	waitTwillReady(t, s)
	running := kubectl("-n", lab.TwillNamespace, "get", "pods", "-l", "app.kubernetes.io/name=twill", "-o", `jsonpath={range .items[*]}{.spec.containers[0].image}{"\n"}{end}`)
	if strings.Count(running, newImage) != len(s.Nodes) {
		t.Fatalf("twill pods after the rolling update run:\n%s", running)
	}
}

// killTwilld sends SIGKILL to the twilld of node (found by its network
// namespace and command line: a process of this lab), and waits until
// kubelet has restarted it and twill is ready again.
func killTwilld(t *testing.T, s *lab.State, node string) {
	t.Helper()
	var nodeNS string
	for _, n := range s.Nodes {
		if n.Name == node {
			nodeNS = "/var/run/netns/" + n.NS
		}
	}
	want, err := os.Stat(nodeNS)
	if err != nil {
		t.Fatal(err)
	}
	pid := 0
	procs, _ := filepath.Glob("/proc/[0-9]*")
	for _, p := range procs {
		cmd, err := os.ReadFile(p + "/cmdline")
		if err != nil || !strings.HasSuffix(strings.SplitN(string(cmd), "\x00", 2)[0], "/twilld") || !strings.Contains(string(cmd), "--kube-subnet-mgr") {
			continue
		}
		if got, err := os.Stat(p + "/ns/net"); err == nil && os.SameFile(got, want) {
			pid, _ = strconv.Atoi(filepath.Base(p))
		}
	}
	if pid == 0 {
		t.Fatalf("no twilld process in %s's network namespace", node)
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatalf("kill -9 %d: %v", pid, err)
	}
	waitFor(t, 10*time.Second, fmt.Sprintf("twilld (pid %d) gone", pid), func() bool {
		_, err := os.Stat(fmt.Sprintf("/proc/%d", pid))
		return err != nil
	})
	restarts := func() string {
		return labKubectl(t, s)("-n", lab.TwillNamespace, "get", "pod", twillPodOn(t, s, node), "-o", "jsonpath={.status.containerStatuses[0].restartCount}")
	}
	waitFor(t, 60*time.Second, "kubelet restarting twilld", func() bool { return restarts() != "0" })
	waitTwillReady(t, s)
}
