package e2e

import (
	"context"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"

	"github.com/twill-net/twill/backend/wireguard/uapi"
	"github.com/twill-net/twill/lab"
)

// TestKubeLabWireGuard: the Kubernetes lab (kubelet, containerd,
// kube-proxy) with dist/kube-twill.yml set to "Type": "wireguard" and
// dist/kube-twill-wireguard.yml beside it, as the docs tell users whose
// kernel has no wireguard module (this machine's). Pods talk across nodes;
// deleting twill's pods, a rolling update of twilld and a key rotation
// (twilld rotate-key) leave a continuous probe without a gap over 1s, the
// devices being the keeper's; a node keeps its key across them; a
// hand-removed peer comes back within 5s; a deleted Node's peer is gone
// from every device within 2s, and the node added back (its kubelet
// registering its Node again) rejoins with nothing crossing the underlay in
// clear.
func TestKubeLabWireGuard(t *testing.T) {
	aloneOnMachine(t)
	l := newLabCtl(t)
	name := labName("kw")
	s := l.upKube(name, 3, 1, "wireguard")
	ctx := context.Background()
	kubectl := labKubectl(t, s)
	l.checkAll(name)

	node := func(i int) string { return s.Nodes[i].Name }
	device := func(i int) *uapi.Client {
		p, err := s.NodePath(node(i), "/var/lib/twill/twill-wg.sock")
		if err != nil {
			t.Fatal(err)
		}
		return &uapi.Client{Path: p}
	}
	peers := func(i int) map[wgtypes.Key]bool {
		d, err := device(i).Get(ctx)
		if err != nil {
			return nil
		}
		m := map[wgtypes.Key]bool{}
		for _, p := range d.Peers {
			m[p.PublicKey] = true
		}
		return m
	}
	keyFile := func(i int) string {
		p, err := s.NodePath(node(i), "/var/lib/twill/wireguard.key")
		if err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		return strings.TrimSpace(string(b))
	}
	pub := func(i int) wgtypes.Key {
		k, err := wgtypes.ParseKey(keyFile(i))
		if err != nil {
			t.Fatal(err)
		}
		return k.PublicKey()
	}
	waitFor(t, 30*time.Second, "every device holding the other nodes' keys", func() bool {
		for i := range s.Nodes {
			got := peers(i)
			for j := range s.Nodes {
				if i != j && !got[pub(j)] {
					return false
				}
			}
		}
		return true
	})
	if got := metricLine(t, s.Nodes[0].NS, 10267, "twill_wireguard_device_info"); !strings.Contains(got, `implementation="userspace"`) {
		t.Errorf("node1's metrics say %q, want the userspace implementation", got)
	}
	twillPod := func(i int) string {
		for _, line := range strings.Split(kubectl("-n", lab.TwillNamespace, "get", "pods", "-l", "app.kubernetes.io/name=twill",
			"-o", `jsonpath={range .items[*]}{.metadata.name} {.spec.nodeName}{"\n"}{end}`), "\n") {
			if f := strings.Fields(line); len(f) == 2 && f[1] == node(i) {
				return f[0]
			}
		}
		t.Fatalf("no twill pod on %s", node(i))
		return ""
	}

	pods := podsByNode(s)
	a, b := pods[node(0)][0], pods[node(1)][0]
	p := startProber(t, s, a, netip.AddrPortFrom(b.IP, lab.EchoPort))
	keys := []string{keyFile(0), keyFile(1)}

	// Every pod holds connections to every pod of another node and to
	// the Service through each event: none may break.
	earlier := earlierBuild(t, s)
	// The underlay is captured through every event of this phase: nothing
	// may cross it in clear.
	phase1 := startCapture(t, s.UnderlayNS())
	d := startKubeDisruption(t, s, l.bin, "wireguard")
	// twilld restarted on both ends, then upgraded (a rolling update).
	d.event("twill pods deleted (node1, node2)", false, func() {
		kubectl("-n", lab.TwillNamespace, "delete", "pod", twillPod(0), twillPod(1), "--wait=true")
		waitTwillReady(t, s)
	})
	d.event("rolling update of the DaemonSet", false, func() { rollTwill(t, s) })
	if got := []string{keyFile(0), keyFile(1)}; got[0] != keys[0] || got[1] != keys[1] {
		t.Fatal("a node's key changed across twilld's restarts")
	}
	keeper := kubectl("-n", lab.TwillNamespace, "get", "pods", "-l", "app.kubernetes.io/name=twill-wireguard", "-o", "jsonpath={.items[*].status.containerStatuses[0].restartCount}")
	if strings.Trim(keeper, "0 ") != "" {
		t.Errorf("keeper restarts %q: the keepers must not be touched by twilld's update", keeper)
	}

	// A key rotation on node1, asked for as the docs say.
	d.event("key rotation (twilld rotate-key, node1)", false, func() {
		old := pub(0)
		kubectl("-n", lab.TwillNamespace, "exec", twillPod(0), "-c", "kube-twill", "--", "twilld", "rotate-key")
		waitFor(t, 30*time.Second, "node2's device using node1's new key", func() bool {
			got := peers(1)
			return pub(0) != old && got[pub(0)] && !got[old]
		})
	})
	d.event("twilld kill -9 (node2), restarted by kubelet", false, func() { killTwilld(t, s, node(1)) })
	d.event("kube-apiserver restart", false, func() { restartControlPlane(t, s, "kube-apiserver") })
	d.event("etcd restart (the apiserver's)", false, func() { restartControlPlane(t, s, "etcd") })
	// Version skew: twilld down to the previous round's build and up again,
	// beside keepers of this one (their DaemonSet is OnDelete).
	d.event("downgrade to "+earlier.name, false, func() { earlier.install(t, s) })
	d.event("upgrade from it to this build", false, func() { thisBuild(s).install(t, s) })
	d.finish()
	checkNothingInClear(t, s, phase1.stop())
	gap, failed, total := p.stop()
	for _, f := range p.failures() {
		t.Logf("probe failed at %s", f.Format("15:04:05.000"))
	}
	t.Logf("pod %s -> %s: %d probes over every event above; %d failed; longest gap %s",
		a.Label(), b.Label(), total, failed, gap.Round(time.Millisecond))
	if gap > time.Second {
		t.Errorf("pod-to-pod traffic stopped for %s; want no gap over 1s", gap)
	}

	// A peer removed by hand from node1's device comes back.
	if err := device(0).Set(ctx, wgtypes.Config{Peers: []wgtypes.PeerConfig{{PublicKey: pub(1), Remove: true}}}); err != nil {
		t.Fatal(err)
	}
	took := waitFor(t, 5*time.Second, "node2's peer back on node1's device", func() bool { return peers(0)[pub(1)] })
	t.Logf("hand-removed peer back in %s", took.Round(time.Millisecond))

	// Then connections between node1's and node2's pods only (node3's pods
	// move, and the Service's backends with them).
	d = startDisruptionBut(t, s, l.bin, "wireguard, Kubernetes lab, node1 and node2", node(2))
	// The keeper's rollout on node1 (its DaemonSet is OnDelete: a pod
	// deleted is replaced by the new template): the userspace devices live
	// in the keeper, so traffic between node1 and the others stops until
	// twilld has the next keeper make them again. It fails closed:
	// nothing crosses the underlay in clear meanwhile.
	d.eventStalls("wireguard keeper pod replaced (node1)", "the devices live in the keeper's process", func() {
		cp := startCapture(t, s.UnderlayNS())
		keeper := kubectl("-n", lab.TwillNamespace, "get", "pods", "-l", "app.kubernetes.io/name=twill-wireguard",
			"--field-selector", "spec.nodeName="+node(0), "-o", "jsonpath={.items[0].metadata.name}")
		kubectl("-n", lab.TwillNamespace, "delete", "pod", keeper, "--wait=true")
		// OnDelete has no rollout status: wait for the new pod itself.
		waitFor(t, 2*time.Minute, "a new keeper on node1, ready", func() bool {
			for _, line := range strings.Split(kubectl("-n", lab.TwillNamespace, "get", "pods", "-l", "app.kubernetes.io/name=twill-wireguard",
				"--field-selector", "spec.nodeName="+node(0), "-o", `jsonpath={range .items[*]}{.metadata.name} {.status.containerStatuses[0].ready}{"\n"}{end}`), "\n") {
				if f := strings.Fields(line); len(f) == 2 && f[0] != keeper && f[1] == "true" {
					return true
				}
			}
			return false
		})
		took := waitFor(t, time.Minute, "node1's device holding node2's peer again", func() bool { return peers(0)[pub(1)] })
		// The capture ends before lab check, whose probes of the nodes'
		// hostPorts cross the underlay in clear, as they should.
		frames := cp.stop()
		l.checkAll(name)
		checkNothingInClear(t, s, frames)
		t.Logf("keeper replaced: node1's device back %s after the old keeper was gone", took.Round(time.Millisecond))
	})
	// node3 drained (its pods evicted) and uncordoned, then removed and
	// added back: the connections between node1's and node2's pods stay,
	// and the underlay is captured through each event (but lab check,
	// whose probes of the nodes' hostPorts cross it in clear, as they
	// should).
	d.event("node3 drained (its pods evicted), uncordoned", false, func() {
		cp := startCapture(t, s.UnderlayNS())
		kubectl("drain", node(2), "--ignore-daemonsets", "--delete-emptydir-data", "--timeout", "3m")
		// The echo Deployment spreads one pod per node (DoNotSchedule):
		// its evicted pod's replacement waits for node3 to take pods again.
		kubectl("uncordon", node(2))
		kubectl("-n", "lab", "rollout", "status", "deploy/echo", "--timeout", "3m")
		frames := cp.stop()
		l.checkAll(name) // the new pods reach, and are reached by, every pod
		checkNothingInClear(t, s, frames)
	})
	// A deleted Node's peer leaves every other device. Its kubelet is held
	// meanwhile.
	resumed, resume := true, func() {}
	t.Cleanup(func() {
		if !resumed {
			resume()
		}
	})
	var cp *capture
	d.event("node3 removed (drained, its Node deleted)", false, func() {
		cp = startCapture(t, s.UnderlayNS())
		gone := pub(2)
		kubectl("drain", node(2), "--ignore-daemonsets", "--delete-emptydir-data", "--timeout", "3m")
		resume, resumed = holdKubelet(t, s, 2), false
		kubectl("delete", "node", node(2), "--wait=true")
		took := waitFor(t, 2*time.Second, "node3's peer gone from node1's and node2's devices", func() bool {
			p0, p1 := peers(0), peers(1)
			return p0 != nil && p1 != nil && !p0[gone] && !p1[gone]
		})
		t.Logf("deleted Node's peer gone in %s", took.Round(time.Millisecond))
	})
	// node3 added back: its kubelet, restarted as when the node reboots,
	// registers its Node, which gets a podCIDR, and twill's and the
	// keeper's pods start there. The capture runs on, through the window
	// where node3's lease is known and its key not yet.
	d.event("node3 added back (its kubelet restarted registers its Node)", false, func() {
		resume()
		resumed = true
		if err := s.RestartKubelet(node(2)); err != nil {
			t.Fatal(err)
		}
		waitFor(t, 3*time.Minute, "node3 registered, with a podCIDR", func() bool {
			out, err := s.Kubectl(ctx, nil, "get", "node", node(2), "-o", "jsonpath={.spec.podCIDR}")
			return err == nil && strings.TrimSpace(out) != ""
		})
		waitTwillReady(t, s)
		waitFor(t, 30*time.Second, "node3's peer on node1's and node2's devices again", func() bool { return peers(0)[pub(2)] && peers(1)[pub(2)] })
		kubectl("-n", "lab", "rollout", "status", "deploy/echo", "--timeout", "3m")
		frames := cp.stop()
		l.checkAll(name) // node3's new pod reaches, and is reached by, every pod
		checkNothingInClear(t, s, frames)
	})
	d.finish()

	if out, err := l.run("down", "--name", name); err != nil {
		t.Fatalf("lab down: %v\n%s", err, out)
	}
	l.requireGone(name)
}
