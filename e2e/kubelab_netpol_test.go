package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/twill-net/twill/lab"
)

// TestKubeNetworkPolicy: on a two-node Kubernetes lab running twill as
// dist/kube-twill.yml installs it (--network-policy on), a NetworkPolicy
// isolates the pods it selects, from other nodes and from their own node;
// a label change lets a client in; a flushed policy chain is put back;
// and a pod whose egress a policy denies never gets a packet through, from
// its container's first instruction on, even while twilld restarts. Then
// ClusterNetworkPolicy's tiers around NetworkPolicy (clusterTiers).
func TestKubeNetworkPolicy(t *testing.T) {
	alone(t)
	l := newLabCtl(t)
	name := labName("kp")
	s := l.upKube(name, 2, 2, "vxlan")
	ctx := context.Background()
	kubectl := labKubectl(t, s)
	pods := podsByNode(s)
	n1, n2 := s.Nodes[0].Name, s.Nodes[1].Name
	a0, a1 := pods[n1][0], pods[n1][1]
	b0, b1 := pods[n2][0], pods[n2][1]
	reaches := func(from, to lab.Pod) bool {
		t.Helper()
		path, err := lab.PodNetNS(s, from)
		if err != nil {
			t.Fatal(err)
		}
		netns, err := ns.GetNS(path)
		if err != nil {
			t.Fatal(err)
		}
		defer netns.Close()
		return echoOnce(netns, netip.AddrPortFrom(to.IP, lab.EchoPort)) == nil
	}
	for _, p := range [][2]lab.Pod{{a0, b0}, {a1, b0}, {b1, b0}, {a1, b1}} {
		if !reaches(p[0], p[1]) {
			t.Fatalf("%s cannot reach %s before any policy", p[0].Label(), p[1].Label())
		}
	}

	kubectl("-n", "lab", "label", "pod", b0.Name, "netpol=target")
	kubectl("-n", "lab", "label", "pod", a0.Name, "role=client")
	apply(t, s, `apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: clients-only, namespace: lab}
spec:
  podSelector: {matchLabels: {netpol: target}}
  ingress:
    - from: [{podSelector: {matchLabels: {role: client}}}]
      ports: [{protocol: TCP, port: `+fmt.Sprint(lab.EchoPort)+`}]
`)
	waitFor(t, 30*time.Second, "b0 isolated from a1", func() bool { return !reaches(a1, b0) })
	if !reaches(a0, b0) {
		t.Errorf("%s (role=client) cannot reach %s across nodes", a0.Label(), b0.Label())
	}
	if reaches(b1, b0) {
		t.Errorf("%s reaches %s on the same node, which the policy forbids", b1.Label(), b0.Label())
	}
	if !reaches(a1, b1) || !reaches(b0, a1) {
		t.Errorf("a pod no policy selects (%s), or an isolated pod's own connection, blocked", b1.Label())
	}

	checkKubeVerdicts(t, s, l.bin, reaches, a0, a1, b0, "lab/clients-only")

	// twillctl status policy on node2 names the policy that isolates b0.
	if out, err := s.NodeExec(ctx, n2, nil, l.bin+"/twillctl", "status", "policy"); !strings.Contains(out, "lab/"+b0.Name) || !strings.Contains(out, "ingress: lab/clients-only") {
		t.Errorf("twillctl status policy on %s (%v) does not name lab/clients-only for %s:\n%s", n2, err, b0.Name, out)
	}

	// A label change lets a1 in.
	start := time.Now()
	kubectl("-n", "lab", "label", "pod", a1.Name, "role=client")
	waitFor(t, 30*time.Second, "a1 let in once labelled role=client", func() bool { return reaches(a1, b0) })
	t.Logf("label change to a packet through: %s (kubectl and the apiserver included)", time.Since(start).Round(time.Millisecond))

	// Drift: the base chain flushed on node2 is put back.
	if out, err := s.NodeExec(ctx, n2, nil, "nft", "flush", "chain", "inet", "twill-policy", "forward"); err != nil {
		t.Fatalf("nft flush on %s: %v\n%s", n2, err, out)
	}
	start = time.Now()
	t.Cleanup(func() {
		if t.Failed() {
			netpolDebug(t, s, n2)
		}
	})
	waitFor(t, 30*time.Second, "node2's policy chain repaired", func() bool { return !reaches(b1, b0) })
	t.Logf("flushed policy chain repaired within %s", time.Since(start).Round(time.Millisecond))

	firstPacket(t, s, b1)
	firstPacketAcrossRestart(t, s, b1, [2]lab.Pod{b1, b0}, "restart", npProbeLabels)

	clusterTiers(t, s, reaches, a0, b0, b1)
}

// npProbeLabels are firstPacket's probe pods' labels: the first's egress
// a NetworkPolicy denies, the second's none selects.
var npProbeLabels = [2]string{"egress: denied", "egress: allowed"}

// firstPacket starts, on node2, a pod whose egress a policy denies and a
// control pod no policy selects, both probing target from their first
// instruction: the first never gets through; the control does. Then it
// does so again while node2's twilld restarts.
func firstPacket(t *testing.T, s *lab.State, target lab.Pod) {
	t.Helper()
	apply(t, s, `apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: no-egress, namespace: lab}
spec:
  podSelector: {matchLabels: {egress: denied}}
  policyTypes: [Egress]
`)
	checkProbes(t, s, target, probePods(t, s, target, "first-packet", 8*time.Second, npProbeLabels))
}

// firstPacketAcrossRestart: node2's twilld pod is deleted (its DaemonSet
// starts another) as the two probe pods start there, probing for 20 s, and
// forbidden (a pod the policy isolates, from a pod it does not let in) is
// probed from the test all along: no forbidden probe gets through, and the
// control pod does once the new twilld knows its address.
func firstPacketAcrossRestart(t *testing.T, s *lab.State, target lab.Pod, forbidden [2]lab.Pod, name string, labels [2]string) {
	t.Helper()
	old := twillPod(t, s, s.Nodes[1].Name)
	stop := make(chan struct{})
	leaked := make(chan string, 1)
	go func() { leaked <- probeUntil(s, forbidden[0], forbidden[1], stop) }()
	if out, err := s.Kubectl(context.Background(), nil, "-n", lab.TwillNamespace, "delete", "pod", old, "--wait=false"); err != nil {
		close(stop)
		t.Fatalf("deleting %s's twill pod %s: %v\n%s", s.Nodes[1].Name, old, err, out)
	}
	pods := probePods(t, s, target, name, 20*time.Second, labels)
	close(stop)
	if msg := <-leaked; msg != "" {
		t.Errorf("while twilld restarted: %s", msg)
	}
	var now, twilldStart string
	kubectl := labKubectl(t, s)
	waitFor(t, 90*time.Second, "a new twill pod running on "+s.Nodes[1].Name, func() bool {
		// The old pod may still be listed, terminating.
		for _, name := range strings.Fields(twillPod(t, s, s.Nodes[1].Name)) {
			if name != old {
				now = name
				twilldStart = kubectl("-n", lab.TwillNamespace, "get", "pod", now, "-o", `jsonpath={.status.containerStatuses[?(@.name=="kube-twill")].state.running.startedAt}`)
				return twilldStart != ""
			}
		}
		return false
	})
	probeStart := kubectl("-n", "lab", "get", "pod", pods[0], "-o", "jsonpath={.status.containerStatuses[0].state.terminated.startedAt}")
	t.Logf("the denied probe pod started at %s, the new twilld at %s", probeStart, twilldStart)
	// The API gives seconds: the probe started no later than the second
	// after the new twilld's, so its 20 s ran over twilld's start and
	// first sync.
	ps, err1 := time.Parse(time.RFC3339, probeStart)
	ts, err2 := time.Parse(time.RFC3339, twilldStart)
	if err1 != nil || err2 != nil || ps.After(ts.Add(time.Second)) {
		t.Errorf("the probe pod (started %q) started after the new twilld (%q): the test missed the restart", probeStart, twilldStart)
	}
	checkProbes(t, s, target, pods)
}

// twillPod is the names of node's twill pods (one, but for a moment two
// while one terminates), or "".
func twillPod(t *testing.T, s *lab.State, node string) string {
	t.Helper()
	return labKubectl(t, s)("-n", lab.TwillNamespace, "get", "pods", "--field-selector", "spec.nodeName="+node, "-o", "jsonpath={.items[*].metadata.name}")
}

// probeUntil probes to from from every 200 ms until stop is closed, and
// says what got through ("" if nothing did).
func probeUntil(s *lab.State, from, to lab.Pod, stop <-chan struct{}) string {
	path, err := lab.PodNetNS(s, from)
	if err != nil {
		return err.Error()
	}
	netns, err := ns.GetNS(path)
	if err != nil {
		return err.Error()
	}
	defer netns.Close()
	through, total := 0, 0
	for {
		select {
		case <-stop:
			if through > 0 {
				return fmt.Sprintf("%s reached %s, which the policy isolates, in %d of %d probes", from.Label(), to.Label(), through, total)
			}
			return ""
		case <-time.After(200 * time.Millisecond):
		}
		total++
		if echoOnce(netns, netip.AddrPortFrom(to.IP, lab.EchoPort)) == nil {
			through++
		}
	}
}

// probePods starts, on node2, <name> (labels[0]: a pod whose packets to
// target policy denies) and <name>-control (labels[1]: one it allows),
// each probing target every 200 ms for d from its first instruction,
// waits for both to finish and returns their names.
func probePods(t *testing.T, s *lab.State, target lab.Pod, name string, d time.Duration, labels [2]string) [2]string {
	t.Helper()
	kubectl := labKubectl(t, s)
	pod := func(name, labels string) string {
		return `apiVersion: v1
kind: Pod
metadata: {name: ` + name + `, namespace: lab, labels: {` + labels + `}}
spec:
  automountServiceAccountToken: false
  restartPolicy: Never
  terminationGracePeriodSeconds: 1
  nodeSelector: {kubernetes.io/hostname: ` + s.Nodes[1].Name + `}
  containers:
    - name: probe
      image: ` + s.LabImage + `
      command: ["/usr/local/bin/twill-lab", "lab", "probe", "--every", "200ms", "--for", "` + d.String() + `", "--port", "` + fmt.Sprint(lab.EchoPort) + `", "` + target.IP.String() + `"]
`
	}
	pods := [2]string{name, name + "-control"}
	apply(t, s, pod(pods[0], labels[0])+"---\n"+pod(pods[1], labels[1]))
	for _, p := range pods {
		waitFor(t, 90*time.Second+d, p+" done", func() bool {
			phase := kubectl("-n", "lab", "get", "pod", p, "-o", "jsonpath={.status.phase}")
			return phase == "Succeeded" || phase == "Failed"
		})
	}
	return pods
}

// checkProbes reads the probe pods' logs: the denied one never got
// through, at one probe every 200 ms for as long as it ran; the control
// did.
func checkProbes(t *testing.T, s *lab.State, target lab.Pod, pods [2]string) {
	t.Helper()
	kubectl := labKubectl(t, s)
	through := func(p string) (ok, total int, firstOK int) {
		firstOK = -1
		for i, line := range strings.Split(strings.TrimSpace(kubectl("-n", "lab", "logs", p)), "\n") {
			var res map[string]string
			if err := json.Unmarshal([]byte(line), &res); err != nil {
				t.Fatalf("%s's log line %q: %v", p, line, err)
			}
			total++
			if r, seen := res[target.IP.String()]; seen && r == "" {
				ok++
				if firstOK < 0 {
					firstOK = i
				}
			}
		}
		return ok, total, firstOK
	}
	ok, total, _ := through(pods[0])
	if total < 20 {
		t.Fatalf("%s probed %d times; want a probe every 200 ms for 8 s or more", pods[0], total)
	}
	if ok != 0 {
		t.Errorf("%s, whose packets a policy denies, got %d of %d probes through", pods[0], ok, total)
	}
	cok, ctotal, first := through(pods[1])
	if cok == 0 {
		t.Fatalf("the control pod %s (allowed) never got through in %d probes", pods[1], ctotal)
	}
	t.Logf("%s, allowed, got its first packet through at probe %d (every 200 ms) of %d", pods[1], first, ctotal)
}

// apply runs kubectl apply on a manifest.
func apply(t *testing.T, s *lab.State, manifest string) {
	t.Helper()
	if out, err := s.Kubectl(context.Background(), strings.NewReader(manifest), "apply", "-f", "-"); err != nil {
		t.Fatalf("kubectl apply: %v\n%s\n%s", err, out, manifest)
	}
}

// netpolDebug logs what a failed policy check needs: the node's policy
// table and its twill pod's log.
func netpolDebug(t *testing.T, s *lab.State, node string) {
	out, err := s.NodeExec(context.Background(), node, nil, "nft", "list", "table", "inet", "twill-policy")
	t.Logf("nft list table inet twill-policy on %s (%v):\n%s", node, err, out)
	pods, _ := s.Kubectl(context.Background(), nil, "-n", lab.TwillNamespace, "get", "pods", "-o",
		`jsonpath={range .items[?(@.spec.nodeName=="`+node+`")]}{.metadata.name}{end}`)
	logs, err := s.Kubectl(context.Background(), nil, "-n", lab.TwillNamespace, "logs", strings.TrimSpace(pods), "-c", "kube-twill")
	t.Logf("twilld on %s (%v):\n%s", node, err, logs)
}
