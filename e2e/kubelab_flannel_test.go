package e2e

import (
	"context"
	"fmt"
	"io"
	"net/netip"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/twill-net/twill/lab"
	kubesm "github.com/twill-net/twill/subnet/kube"
	"github.com/twill-net/twill/testsupport/kubetest"
)

// TestKubeLabFlannelTakeover: a Kubernetes lab (kubelet, containerd,
// kube-proxy) on kube-flannel's DaemonSet, with the echo Deployment spread
// over its nodes, is switched to twill node by node as
// Documentation/migrating-from-flannel.md says (kube-flannel patched with
// dist/flannel-migration/kube-flannel.patch.yaml, dist/flannel-migration
// applied, a label per node), one node is rolled back to kube-flannel and
// switched again, and then a node is drained, removed and added back, while
// every pod holds connections to every pod of the other nodes and to the
// Service (the disruption harness): none breaks, no running pod restarts,
// no probe gap passes 1 s, every new pod (twill's, and flannel's after the
// rollback) gets an address no running pod holds and reaches every pod
// both ways; once the flannel-wired pods are replaced nothing of flannel's
// is left on a node, and a deleted Node is gone from every node's routes
// within 2 s.
func TestKubeLabFlannelTakeover(t *testing.T) {
	alone(t)
	for _, backend := range []string{"vxlan", "host-gw"} {
		t.Run(backend, func(t *testing.T) { testKubeLabFlannel(t, backend) })
	}
}

// flannelLab is a Kubernetes lab on kube-flannel being switched to twill.
type flannelLab struct {
	t       *testing.T
	l       *labCtl
	name    string
	s       *lab.State
	kubectl func(stdin string, args ...string) string
}

func testKubeLabFlannel(t *testing.T, backend string) {
	l := newLabCtl(t)
	images := labImages(t, l.bin, flannelImages, "e2e")
	name := labName("f" + backend[:1])
	l.up(name, "--kubernetes", "--flannel", "--nodes", "3", "--pods-per-node", "1", "--backend", backend,
		"--kube-bin-dir", kubeBinDir(t), "--image-dir", images)
	s, err := lab.Load(l.root, name)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	f := &flannelLab{t: t, l: l, name: name, s: s, kubectl: func(stdin string, args ...string) string {
		t.Helper()
		var in io.Reader
		if stdin != "" {
			in = strings.NewReader(stdin)
		}
		out, err := s.Kubectl(ctx, in, args...)
		if err != nil {
			t.Fatalf("kubectl %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return out
	}}
	kubectl := f.kubectl
	bridgePods := slices.Clone(s.Pods)
	uids := map[string]string{}
	for _, p := range bridgePods {
		uids[p.Name] = p.UID
	}
	var probes []*prober
	for i, p := range bridgePods {
		q := bridgePods[(i+1)%len(bridgePods)]
		probes = append(probes, startProber(t, s, p, netip.AddrPortFrom(q.IP, lab.EchoPort)))
	}
	d := startKubeDisruption(t, s, l.bin, backend+", the takeover from kube-flannel")

	// kube-flannel off labelled nodes, and cleaning up after twill where
	// a node rolls back; twill beside it, on flannel's network
	// (net-conf.json as kube-flannel's).
	root := kubetest.Root(t)
	d.event("kube-flannel patched (its pods restart once)", false, func() {
		kubectl("", "-n", lab.FlannelNamespace, "patch", "ds", lab.FlannelDaemonSet, "--patch-file", filepath.Join(root, "dist", "flannel-migration", "kube-flannel.patch.yaml"))
		kubectl("", "-n", lab.FlannelNamespace, "rollout", "status", "ds/"+lab.FlannelDaemonSet, "--timeout", "3m")
	})
	kubectl(kubectl("", "kustomize", "--load-restrictor", "LoadRestrictionsNone", filepath.Join(root, "dist", "flannel-migration")),
		"apply", "-f", "-")
	netConf := kubectl("", "-n", lab.FlannelNamespace, "get", "configmap", "kube-flannel-cfg", "-o", `go-template={{index .data "net-conf.json" | printf "%q"}}`)
	kubectl("", "-n", lab.TwillNamespace, "patch", "configmap", "kube-twill-cfg", "--type", "merge", "-p", `{"data":{"net-conf.json":`+netConf+`}}`)

	flannelSubnets := map[string]string{}
	for _, n := range s.Nodes {
		flannelSubnets[n.Name] = envValue(t, s, n.Name, "/run/flannel/subnet.env", "FLANNEL_SUBNET")
	}
	for i, n := range s.Nodes {
		d.event(n.Name+" switched to twill", false, func() { f.switchNode(n.Name) })
		if got, want := envValue(t, s, n.Name, "/run/twill/subnet.env", "TWILL_SUBNET"), flannelSubnets[n.Name]; netip.MustParsePrefix(got).Masked() != netip.MustParsePrefix(want).Masked() {
			t.Errorf("%s: twill's subnet %s, flannel's was %s", n.Name, got, want)
		}
		// A new pod on the switched node: twill wires it, at an address no
		// running pod holds, and every pod reaches every pod.
		f.newPod(fmt.Sprintf("tw-%d", i+1), n.Name, "dev tw")
		f.checkLeases(n.Name, func(j int) bool { return j > i })
	}

	// node3 back to kube-flannel (its label removed), then to twill again.
	last := s.Nodes[len(s.Nodes)-1].Name
	d.event(last+" rolled back to kube-flannel", false, func() { f.rollBack(last) })
	f.newPod("fl-back", last, "dev cni0")
	f.checkLeases(s.Nodes[0].Name, func(j int) bool { return j == len(s.Nodes)-1 })
	d.event(last+" switched to twill again", false, func() { f.switchNode(last) })
	d.finish()
	for i, p := range probes {
		gap, failed, total := p.stop()
		t.Logf("probe %s -> %s: %d of %d failed, longest gap %s", bridgePods[i].Label(), bridgePods[(i+1)%len(bridgePods)].Label(),
			failed, total, gap.Round(time.Millisecond))
		if gap > time.Second {
			t.Errorf("probe from %s: a gap of %s, want at most 1s", bridgePods[i].Label(), gap)
		}
	}
	if err := s.RefreshPods(ctx); err != nil {
		t.Fatal(err)
	}
	for _, p := range s.Pods {
		if u, ok := uids[p.Name]; ok && u != p.UID {
			t.Errorf("pod %s was restarted (uid %s, was %s)", p.Name, p.UID, u)
		}
	}

	// The flannel-wired pods replaced (the lab's, the one of the rollback,
	// and CoreDNS's): nothing of flannel's stays.
	for _, p := range bridgePods {
		kubectl("", "-n", "lab", "delete", "pod", p.Name, "--wait=true")
	}
	kubectl("", "-n", "lab", "delete", "pod", "fl-back", "--wait=true")
	kubectl("", "-n", "kube-system", "delete", "pod", "-l", "k8s-app=kube-dns", "--wait=true")
	for _, n := range s.Nodes {
		f.noFlannelLeft(n.Name)
	}
	// Every node switched: kube-flannel and its conflist go, as the guide
	// says.
	kubectl("", "delete", "namespace", lab.FlannelNamespace, "--wait=true")
	for _, n := range s.Nodes {
		if out, err := s.NodeExec(ctx, n.Name, nil, "rm", "-f", "/etc/cni/net.d/10-flannel.conflist"); err != nil {
			t.Fatalf("removing 10-flannel.conflist on %s: %v\n%s", n.Name, err, out)
		}
	}
	f.nodeLifecycle(backend)
}

// switchNode labels node for twill and waits until twill's pod there is
// ready and kube-flannel's gone.
func (f *flannelLab) switchNode(node string) {
	f.t.Helper()
	f.kubectl("", "label", "node", node, "twill.io/network=twill")
	f.waitAgents(node, true)
}

// rollBack removes node's label and waits until kube-flannel's pod there
// is ready (its twill-cleanup init container done: twill's conflist gone)
// and twill's gone.
func (f *flannelLab) rollBack(node string) {
	f.t.Helper()
	f.kubectl("", "label", "node", node, "twill.io/network-")
	f.waitAgents(node, false)
	// twilld's mark on the Node, which twillctl tells flannel's nodes by.
	f.kubectl("", "annotate", "node", node, kubesm.FlannelAnnotationPrefix+"/"+kubesm.AnnNodeAgent+"-")
	if out, err := f.s.NodeExec(context.Background(), node, nil, "ls", "/etc/cni/net.d"); err != nil || strings.Contains(out, "twill") {
		f.t.Errorf("%s rolled back: /etc/cni/net.d holds %q (%v), want flannel's conflist only", node, out, err)
	}
}

// waitAgents waits until node runs twill's pod (ready) and not
// kube-flannel's, or (twill false) the other way round.
func (f *flannelLab) waitAgents(node string, twill bool) {
	f.t.Helper()
	ctx := context.Background()
	// Each pod of ns on node, as name=<its Ready condition>.
	pods := func(ns string) string {
		out, _ := f.s.Kubectl(ctx, nil, "-n", ns, "get", "pods", "--field-selector", "spec.nodeName="+node,
			"-o", `jsonpath={range .items[*]}{.metadata.name}={.status.conditions[?(@.type=="Ready")].status} {end}`)
		return strings.TrimSpace(out)
	}
	on, off := lab.TwillNamespace, lab.FlannelNamespace
	if !twill {
		on, off = off, on
	}
	waitFor(f.t, 3*time.Minute, fmt.Sprintf("%s: %s's pod ready, %s's gone", node, on, off), func() bool {
		want := pods(on)
		return strings.HasSuffix(want, "=True") && !strings.Contains(want, " ") && pods(off) == ""
	})
}

// newPod starts an echo pod on node and checks that the agent of the node
// wired it (its /32 route or the bridge's subnet route: route says which),
// at an address no running pod holds, and that every pod reaches every pod.
func (f *flannelLab) newPod(pod, node, route string) {
	f.t.Helper()
	ctx := context.Background()
	f.kubectl(fmt.Sprintf(newPodManifest, pod, node, f.s.LabImage, lab.EchoPort, lab.EchoPort), "-n", "lab", "apply", "-f", "-")
	f.kubectl("", "-n", "lab", "wait", "--for=condition=Ready", "pod/"+pod, "--timeout", "2m")
	if err := f.s.RefreshPods(ctx); err != nil {
		f.t.Fatal(err)
	}
	seen := map[netip.Addr]string{}
	for _, p := range f.s.Pods {
		if o, dup := seen[p.IP]; dup {
			f.t.Fatalf("%s on %s: pods %s and %s share %s", pod, node, o, p.Name, p.IP)
		}
		seen[p.IP] = p.Name
		if p.Name == pod {
			if r, _ := f.s.NodeExec(ctx, node, nil, "ip", "route", "get", p.IP.String()); !strings.Contains(r, route) {
				f.t.Errorf("%s at %s: the route to it is %q, want %q", pod, p.IP, r, route)
			}
		}
	}
	allReachAll(f.t, f.s, pod+" started on "+node)
}

// checkLeases checks that twillctl leases, on node, names the nodes still
// on flannel (onFlannel, by index) and only those.
func (f *flannelLab) checkLeases(node string, onFlannel func(j int) bool) {
	f.t.Helper()
	out, err := f.l.run("exec", "--name", f.name, node, "--", "twillctl", "leases", "--kube-annotation-prefix", "flannel.alpha.coreos.com")
	if err != nil {
		f.t.Fatalf("twillctl leases on %s: %v\n%s", node, err, out)
	}
	for j, o := range f.s.Nodes {
		got := strings.Contains(lineOf(out, o.Name+" "), "peer (flannel)")
		if got != onFlannel(j) {
			f.t.Errorf("twillctl leases on %s says of %s: %q (on flannel: %v, want %v)", node, o.Name, lineOf(out, o.Name+" "), got, onFlannel(j))
		}
	}
}

// noFlannelLeft waits until nothing of flannel's is left on node: cni0,
// flannel.1, its subnet.env, its iptables chains.
func (f *flannelLab) noFlannelLeft(node string) {
	f.t.Helper()
	var left string
	f.t.Cleanup(func() {
		if f.t.Failed() {
			logs, _ := f.s.Kubectl(context.Background(), nil, "-n", lab.TwillNamespace, "logs", "--tail", "30", "-l", "app.kubernetes.io/name=twill", "--prefix")
			f.t.Logf("%s: flannel's left:\n%s\ntwill's logs:\n%s", node, left, logs)
		}
	})
	waitFor(f.t, 60*time.Second, node+": nothing of flannel's left", func() bool {
		left, _ = f.s.NodeExec(context.Background(), node, nil, "sh", "-c",
			"ip -o link show cni0 2>/dev/null; ip -o link show flannel.1 2>/dev/null; ls /run/flannel/subnet.env 2>/dev/null; iptables-save 2>/dev/null | grep -c FLANNEL; true")
		return strings.TrimSpace(left) == "0"
	})
}

// nodeLifecycle holds connections between node1's and node2's pods while
// node3 is drained and uncordoned, removed (drained, its Node deleted, its
// kubelet held meanwhile), and added back (its kubelet restarted, as when the node
// reboots: it registers its Node, which gets a podCIDR, and twill's pod
// starts there): none breaks, the deleted Node leaves every node's routes
// within 2 s, and the node added back reaches and is reached by every pod.
func (f *flannelLab) nodeLifecycle(backend string) {
	t, s, kubectl := f.t, f.s, f.kubectl
	t.Helper()
	ctx := context.Background()
	kubectl("", "-n", "lab", "rollout", "status", "deploy/echo", "--timeout", "3m")
	last := len(s.Nodes) - 1
	node3 := s.Nodes[last].Name
	d := startDisruptionBut(t, s, f.l.bin, backend+", after the takeover, node1 and node2", node3)
	d.event(node3+" drained (its pods evicted), uncordoned", false, func() {
		kubectl("", "drain", node3, "--ignore-daemonsets", "--delete-emptydir-data", "--force", "--timeout", "3m")
		kubectl("", "uncordon", node3)
		kubectl("", "-n", "lab", "rollout", "status", "deploy/echo", "--timeout", "3m")
	})
	cidr := strings.TrimSpace(kubectl("", "get", "node", node3, "-o", "jsonpath={.spec.podCIDR}"))
	resumed := true
	resume := func() {}
	t.Cleanup(func() {
		if !resumed {
			resume()
		}
	})
	// A node leaves as an operator takes one out: drained, then its Node
	// deleted. (Pods left running on a deleted Node keep the addresses of
	// its podCIDR, which it loses: no network plugin can route them.)
	d.event(node3+" removed (drained, its Node deleted)", false, func() {
		kubectl("", "drain", node3, "--ignore-daemonsets", "--delete-emptydir-data", "--force", "--timeout", "3m")
		resume, resumed = holdKubelet(t, s, last), false
		kubectl("", "delete", "node", node3, "--wait=true")
		for _, n := range s.Nodes[:last] {
			waitFor(t, 2*time.Second, n.Name+": the deleted Node's route gone", func() bool {
				r, _ := s.NodeExec(ctx, n.Name, nil, "ip", "route", "show", cidr)
				return strings.TrimSpace(r) == ""
			})
		}
	})
	d.event(node3+" added back (its kubelet restarted registers its Node)", false, func() {
		resume()
		resumed = true
		if err := s.RestartKubelet(node3); err != nil {
			t.Fatal(err)
		}
		waitFor(t, 3*time.Minute, node3+" registered, with a podCIDR", func() bool {
			out, err := s.Kubectl(ctx, nil, "get", "node", node3, "-o", "jsonpath={.spec.podCIDR}")
			return err == nil && strings.TrimSpace(out) != ""
		})
		// twill's DaemonSet keeps the migration's nodeSelector: a new
		// Node is labelled for it (Documentation/migrating-from-flannel.md).
		kubectl("", "label", "node", node3, "twill.io/network=twill")
		f.waitAgents(node3, true)
		kubectl("", "-n", "lab", "rollout", "status", "deploy/echo", "--timeout", "3m")
		if err := s.RefreshPods(ctx); err != nil {
			t.Fatal(err)
		}
		allReachAll(t, s, node3+" added back")
	})
	d.finish()
}

// newPodManifest is an echo pod pinned to a node: name, node, image, port,
// port.
const newPodManifest = `apiVersion: v1
kind: Pod
metadata: {name: %s, labels: {app: takeover}}
spec:
  nodeName: %s
  automountServiceAccountToken: false
  terminationGracePeriodSeconds: 1
  containers:
    - name: echo
      image: %s
      command: ["/usr/local/bin/twill-lab", "lab", "echo-server", "--port", "%d"]
      readinessProbe: {tcpSocket: {port: %d}, periodSeconds: 1}
`

// lineOf is the first line of out that starts with prefix.
func lineOf(out, prefix string) string {
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(l, prefix) {
			return l
		}
	}
	return ""
}

// envValue reads one variable of an env file on a lab node.
func envValue(t *testing.T, s *lab.State, node, path, key string) string {
	t.Helper()
	out, err := s.NodeExec(context.Background(), node, nil, "cat", path)
	if err != nil {
		t.Fatalf("%s on %s: %v", path, node, err)
	}
	for _, l := range strings.Split(out, "\n") {
		if v, ok := strings.CutPrefix(l, key+"="); ok {
			return v
		}
	}
	t.Fatalf("no %s in %s on %s:\n%s", key, path, node, out)
	return ""
}

// allReachAll connects from every lab pod to every other one's echo
// server.
func allReachAll(t *testing.T, s *lab.State, when string) {
	t.Helper()
	var from []lab.Vantage
	var to []lab.Target
	for _, p := range s.Pods {
		nsPath, err := lab.PodNetNS(s, p)
		if err != nil {
			t.Fatal(err)
		}
		from = append(from, lab.Vantage{Name: p.Label(), NetNS: nsPath})
		to = append(to, lab.Target{Name: p.Label(), Addr: netip.AddrPortFrom(p.IP, lab.EchoPort)})
	}
	var r lab.Result
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(500 * time.Millisecond) {
		if r = lab.Matrix(context.Background(), s.BinDir, from, to); r.Failed == 0 {
			return
		}
	}
	t.Fatalf("%s: %d of %d pod pairs fail: %v", when, r.Failed, len(from)*len(to), r.Errors)
}
