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
	"github.com/twill-net/twill/testsupport/kubetest"
)

// TestKubeLabFlannelTakeover: a Kubernetes lab (kubelet, containerd,
// kube-proxy) on kube-flannel's DaemonSet, with the echo Deployment spread
// over its nodes, is switched to twill node by node as
// Documentation/migrating-from-flannel.md says (kube-flannel kept off
// labelled nodes, dist/flannel-migration applied, a label per node), with
// pods probing each other all along. No running pod restarts, no probe
// gap passes 1 s, every new (twill-wired) pod gets an address no running
// pod holds and reaches every pod both ways; once the flannel-wired pods
// are replaced nothing of flannel's is left on a node, and a Node deleted
// after the last switch is gone from every node's routes within 2 s.
func TestKubeLabFlannelTakeover(t *testing.T) {
	alone(t)
	for _, backend := range []string{"vxlan", "host-gw"} {
		t.Run(backend, func(t *testing.T) { testKubeLabFlannel(t, backend) })
	}
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
	kubectl := func(stdin string, args ...string) string {
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
	}
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

	// kube-flannel off labelled nodes; twill beside it, on flannel's
	// network (net-conf.json as kube-flannel's).
	kubectl("", "-n", lab.FlannelNamespace, "patch", "ds", lab.FlannelDaemonSet, "--type", "merge", "-p",
		`{"spec":{"template":{"spec":{"affinity":{"nodeAffinity":{"requiredDuringSchedulingIgnoredDuringExecution":{"nodeSelectorTerms":[{"matchExpressions":[{"key":"twill.io/network","operator":"NotIn","values":["twill"]}]}]}}}}}}}`)
	kubectl("", "-n", lab.FlannelNamespace, "rollout", "status", "ds/"+lab.FlannelDaemonSet, "--timeout", "3m")
	kubectl(kubectl("", "kustomize", "--load-restrictor", "LoadRestrictionsNone", filepath.Join(kubetest.Root(t), "dist", "flannel-migration")),
		"apply", "-f", "-")
	netConf := kubectl("", "-n", lab.FlannelNamespace, "get", "configmap", "kube-flannel-cfg", "-o", `go-template={{index .data "net-conf.json" | printf "%q"}}`)
	kubectl("", "-n", lab.TwillNamespace, "patch", "configmap", "kube-twill-cfg", "--type", "merge", "-p", `{"data":{"net-conf.json":`+netConf+`}}`)

	flannelSubnets := map[string]string{}
	for _, n := range s.Nodes {
		flannelSubnets[n.Name] = envValue(t, s, n.Name, "/run/flannel/subnet.env", "FLANNEL_SUBNET")
	}
	for i, n := range s.Nodes {
		kubectl("", "label", "node", n.Name, "twill.io/network=twill")
		waitFor(t, 3*time.Minute, n.Name+" switched: twill's pod ready, flannel's gone", func() bool {
			tw, _ := s.Kubectl(ctx, nil, "-n", lab.TwillNamespace, "get", "pods", "--field-selector", "spec.nodeName="+n.Name,
				"-o", `jsonpath={range .items[*]}{.status.conditions[?(@.type=="Ready")].status}{end}`)
			fl, _ := s.Kubectl(ctx, nil, "-n", lab.FlannelNamespace, "get", "pods", "--field-selector", "spec.nodeName="+n.Name, "-o", "name")
			return strings.TrimSpace(tw) == "True" && strings.TrimSpace(fl) == ""
		})
		if got, want := envValue(t, s, n.Name, "/run/twill/subnet.env", "TWILL_SUBNET"), flannelSubnets[n.Name]; netip.MustParsePrefix(got).Masked() != netip.MustParsePrefix(want).Masked() {
			t.Errorf("%s: twill's subnet %s, flannel's was %s", n.Name, got, want)
		}
		// A new pod on the switched node: twill wires it, at an address no
		// running pod holds, and every pod reaches every pod.
		pod := fmt.Sprintf("tw-%d", i+1)
		kubectl(fmt.Sprintf(newPodManifest, pod, n.Name, s.LabImage, lab.EchoPort, lab.EchoPort), "-n", "lab", "apply", "-f", "-")
		kubectl("", "-n", "lab", "wait", "--for=condition=Ready", "pod/"+pod, "--timeout", "2m")
		if err := s.RefreshPods(ctx); err != nil {
			t.Fatal(err)
		}
		for _, p := range s.Pods {
			if p.Name == pod {
				if r, _ := s.NodeExec(ctx, n.Name, nil, "ip", "route", "show", p.IP.String()+"/32"); !strings.Contains(r, "dev tw") {
					t.Errorf("%s at %s is not wired by twill (no /32 route to a twill veth): %q", pod, p.IP, r)
				}
			}
		}
		seen := map[netip.Addr]string{}
		for _, p := range s.Pods {
			if o, dup := seen[p.IP]; dup {
				t.Fatalf("after %s switched: pods %s and %s share %s", n.Name, o, p.Name, p.IP)
			}
			seen[p.IP] = p.Name
		}
		allReachAll(t, s, fmt.Sprintf("after %s switched", n.Name))
		// twillctl leases names the nodes still on flannel.
		out, err := l.run("exec", "--name", name, n.Name, "--", "twillctl", "leases", "--kube-annotation-prefix", "flannel.alpha.coreos.com")
		if err != nil {
			t.Fatalf("twillctl leases on %s: %v\n%s", n.Name, err, out)
		}
		for j, o := range s.Nodes {
			onFlannel := strings.Contains(lineOf(out, o.Name+" "), "peer (flannel)")
			if onFlannel != (j > i) {
				t.Errorf("after %s switched, twillctl leases says of %s: %q (on flannel: %v, want %v)", n.Name, o.Name, lineOf(out, o.Name+" "), onFlannel, j > i)
			}
		}
	}
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

	// The flannel-wired pods replaced (the lab's, and CoreDNS's): nothing
	// of flannel's stays.
	for _, p := range bridgePods {
		kubectl("", "-n", "lab", "delete", "pod", p.Name, "--wait=true")
	}
	kubectl("", "-n", "kube-system", "delete", "pod", "-l", "k8s-app=kube-dns", "--wait=true")
	for _, n := range s.Nodes {
		var left string
		t.Cleanup(func() {
			if t.Failed() {
				logs, _ := s.Kubectl(ctx, nil, "-n", lab.TwillNamespace, "logs", "--tail", "30", "-l", "app.kubernetes.io/name=twill", "--prefix")
				t.Logf("%s: flannel's left:\n%s\ntwill's logs:\n%s", n.Name, left, logs)
			}
		})
		waitFor(t, 60*time.Second, n.Name+": nothing of flannel's left", func() bool {
			left, _ = s.NodeExec(ctx, n.Name, nil, "sh", "-c",
				"ip -o link show cni0 2>/dev/null; ip -o link show flannel.1 2>/dev/null; ls /run/flannel/subnet.env 2>/dev/null; iptables-save 2>/dev/null | grep -c FLANNEL; true")
			return strings.TrimSpace(left) == "0"
		})
	}

	// A Node deleted (its kubelet held, so it does not register it again)
	// is gone from the other nodes' routes within 2 s.
	last := s.Nodes[len(s.Nodes)-1]
	cidr := strings.TrimSpace(kubectl("", "get", "node", last.Name, "-o", "jsonpath={.spec.podCIDR}"))
	defer holdKubelet(t, s, len(s.Nodes)-1)()
	kubectl("", "delete", "node", last.Name, "--wait=true")
	for _, n := range s.Nodes[:len(s.Nodes)-1] {
		waitFor(t, 2*time.Second, n.Name+": the deleted Node's route gone", func() bool {
			r, _ := s.NodeExec(ctx, n.Name, nil, "ip", "route", "show", cidr)
			return strings.TrimSpace(r) == ""
		})
	}
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
