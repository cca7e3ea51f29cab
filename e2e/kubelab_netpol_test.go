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

	"github.com/twill-net/twill/internal/lab"
)

// TestKubeNetworkPolicy: on a two-node Kubernetes lab running twill as
// dist/kube-twill.yml installs it (--network-policy on), a NetworkPolicy
// isolates the pods it selects, from other nodes and from their own node;
// a label change lets a client in; a flushed policy chain is put back;
// and a pod whose egress a policy denies never gets a packet through, from
// its container's first instruction on.
func TestKubeNetworkPolicy(t *testing.T) {
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
}

// firstPacket starts, on node2, a pod whose egress a policy denies and a
// control pod no policy selects, both probing target from their first
// instruction: the first never gets through; the control does.
func firstPacket(t *testing.T, s *lab.State, target lab.Pod) {
	t.Helper()
	kubectl := labKubectl(t, s)
	apply(t, s, `apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: no-egress, namespace: lab}
spec:
  podSelector: {matchLabels: {egress: denied}}
  policyTypes: [Egress]
`)
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
      image: ` + s.TwillImage + `
      command: ["/usr/local/bin/twillctl", "lab", "probe", "--every", "200ms", "--for", "8s", "--port", "` + fmt.Sprint(lab.EchoPort) + `", "` + target.IP.String() + `"]
`
	}
	apply(t, s, pod("first-packet", "egress: denied")+"---\n"+pod("first-packet-control", "egress: allowed"))
	for _, p := range []string{"first-packet", "first-packet-control"} {
		waitFor(t, 90*time.Second, p+" done", func() bool {
			phase := kubectl("-n", "lab", "get", "pod", p, "-o", "jsonpath={.status.phase}")
			return phase == "Succeeded" || phase == "Failed"
		})
	}
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
	ok, total, _ := through("first-packet")
	if total < 20 {
		t.Fatalf("first-packet probed %d times; want a probe every 200 ms for 8 s", total)
	}
	if ok != 0 {
		t.Errorf("first-packet, whose egress a policy denies, got %d of %d probes through", ok, total)
	}
	cok, ctotal, first := through("first-packet-control")
	if cok == 0 {
		t.Fatalf("the control pod (no policy) never got through in %d probes: the probe itself is broken", ctotal)
	}
	t.Logf("a new pod no policy selects got its first packet through at probe %d (every 200 ms) of %d", first, ctotal)
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
