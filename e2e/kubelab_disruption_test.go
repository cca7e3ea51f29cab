package e2e

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/twill-net/twill/backend/wireguard"
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
	d := startDisruption(t, backend+", Kubernetes lab", bin, from, to, pairs)
	d.diagnose = kubeDiagnose(t, s)
	return d
}

// kubeDiagnose logs, for an event that broke held connections, what twill's
// pods (twilld, and the wireguard keepers) logged from since on, with
// their times, so that a rare failure leaves its evidence in the test's
// output.
func kubeDiagnose(t *testing.T, s *lab.State) func(string, time.Time) {
	return func(event string, since time.Time) {
		for _, app := range []string{"twill", "twill-wireguard"} {
			out, err := s.Kubectl(context.Background(), nil, "-n", lab.TwillNamespace, "logs", "-l", "app.kubernetes.io/name="+app,
				"--all-containers", "--prefix", "--timestamps", "--since-time", since.UTC().Format(time.RFC3339), "--max-log-requests", "20")
			t.Logf("%s broke held connections; %s pods' logs since %s (%v):\n%s", event, app, since.Format("15:04:05.000"), err, out)
		}
	}
}

// startDisruptionBut holds connections between the pods of every node but
// leaving, each to every pod of another of those nodes (not through the
// Service, whose backends may be leaving's pods), while leaving's pods move
// or go.
func startDisruptionBut(t *testing.T, s *lab.State, bin, title, leaving string) *disruption {
	t.Helper()
	from, to, pairs, err := lab.HoldPlan(context.Background(), s)
	if err != nil {
		t.Fatal(err)
	}
	nodeOf := map[string]string{}
	for _, p := range s.Pods {
		nodeOf[p.Label()], nodeOf[p.Label()+"-v6"] = p.Node, p.Node
	}
	stays := func(name string) bool { n, ok := nodeOf[name]; return ok && n != leaving }
	from = slices.DeleteFunc(from, func(v lab.Vantage) bool { return !stays(v.Name) })
	d := startDisruption(t, title, bin, from, to, func(v lab.Vantage, tg lab.Target) bool {
		return pairs(v, tg) && stays(v.Name) && stays(tg.Name)
	})
	d.diagnose = kubeDiagnose(t, s)
	return d
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

// restartControlPlane restarts the lab's process of role (lab restart)
// and waits until twill is ready on every node again.
func restartControlPlane(t *testing.T, s *lab.State, role string) {
	t.Helper()
	if err := s.Restart(context.Background(), role); err != nil {
		t.Fatal(err)
	}
	waitTwillReady(t, s)
}

// checkNothingInClear fails if a captured underlay frame of a Kubernetes
// lab carries a pod's address or the harness's payload in clear, or if
// two nodes exchanged anything but WireGuard.
func checkNothingInClear(t *testing.T, s *lab.State, frames [][]byte) {
	t.Helper()
	if err := s.RefreshPods(context.Background()); err != nil {
		t.Fatal(err)
	}
	nodes := map[netip.Addr]bool{}
	for _, n := range s.Nodes {
		nodes[n.Addr] = true
	}
	var pods []netip.Addr
	for _, p := range s.Pods {
		pods = append(pods, p.Addrs()...)
	}
	wg, err := onlyWireGuard(frames, nodes, pods, []byte(lab.HoldMarker), wireguard.DefaultListenPort)
	if err != nil {
		t.Errorf("the underlay: %v", err)
	}
	t.Logf("the underlay: %d frames captured, %d WireGuard between nodes, none with a pod's address or the payload in clear", len(frames), wg)
}
