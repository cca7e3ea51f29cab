package e2e

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/rest"

	"github.com/twill-net/twill/lab"
	"github.com/twill-net/twill/testsupport/kubetest"
)

// upKube brings up a Kubernetes lab of nodes nodes, podsPerNode pods each,
// on the e2e images (extra: more lab up flags), and returns its state.
func (l *labCtl) upKube(name string, nodes, podsPerNode int, backend string, extra ...string) *lab.State {
	l.t.Helper()
	images := labImages(l.t, l.bin, kubeImages, "e2e")
	l.up(name, append([]string{"--kubernetes", "--nodes", strconv.Itoa(nodes), "--pods-per-node", strconv.Itoa(podsPerNode), "--backend", backend,
		"--kube-bin-dir", kubeBinDir(l.t), "--image-dir", images, "--crd", kubetest.ClusterPolicyCRD(l.t)}, extra...)...)
	s, err := lab.Load(l.root, name)
	if err != nil {
		l.t.Fatal(err)
	}
	return s
}

// kubeBinDir builds (or finds cached) the Kubernetes binaries.
func kubeBinDir(t testing.TB) string {
	t.Helper()
	apiserver, _ := kubetest.Binaries(t)
	return filepath.Dir(apiserver)
}

// hostPaths are machine paths a Kubernetes lab's kubelets, containerds and
// control plane must never create.
var hostPaths = []string{"/etc/cni", "/opt/cni", "/var/lib/kubelet", "/var/lib/cni", "/run/containerd", "/var/lib/containerd",
	"/var/log/pods", "/var/log/containers", "/run/twill", "/var/lib/twill", "/etc/kubernetes", "/usr/libexec/kubernetes"}

// hostSysctls are machine-wide settings kubelet or kube-proxy would change
// if let.
var hostSysctls = []string{"vm/overcommit_memory", "vm/panic_on_oom", "kernel/panic", "kernel/panic_on_oops",
	"kernel/keys/root_maxkeys", "kernel/keys/root_maxbytes", "net/ipv4/ip_forward", "net/ipv6/conf/all/forwarding", "net/netfilter/nf_conntrack_max",
	"net/netfilter/nf_conntrack_tcp_timeout_close_wait", "net/netfilter/nf_conntrack_tcp_timeout_established"}

type hostSnapshot map[string]string

func snapshotHost() hostSnapshot {
	s := hostSnapshot{}
	for _, p := range hostPaths {
		_, err := os.Stat(p)
		s[p] = fmt.Sprint(err == nil)
	}
	for _, k := range hostSysctls {
		b, _ := os.ReadFile("/proc/sys/" + k)
		s[k] = strings.TrimSpace(string(b))
	}
	s["hostname"], _ = os.Hostname()
	return s
}

// TestKubeLab runs twill as users install it, under real kubelets and
// containerds: `twillctl lab up --kubernetes` applies dist/kube-twill.yml,
// and the test checks what an operator would, for host-gw and vxlan.
func TestKubeLab(t *testing.T) {
	alone(t)
	for _, backend := range []string{"host-gw", "vxlan"} {
		t.Run(backend, func(t *testing.T) { testKubeLab(t, backend) })
	}
}

func testKubeLab(t *testing.T, backend string) {
	l := newLabCtl(t)
	before := snapshotHost()
	name := labName("k" + backend[:1])
	s := l.upKube(name, 2, 2, backend)
	ctx := context.Background()
	kubectl := labKubectl(t, s)

	// The DaemonSet rolled out and every Node says its network is up.
	if why, err := s.TwillReady(ctx); err != nil || why != "" {
		t.Fatalf("twill not ready after lab up: %s %v", why, err)
	}
	cond := kubectl("get", "nodes", "-o", `jsonpath={range .items[*]}{.metadata.name}={.status.conditions[?(@.type=="NetworkUnavailable")].status}/{.status.conditions[?(@.type=="NetworkUnavailable")].reason}{"\n"}{end}`)
	if strings.Count(cond, "=False/TwillIsUp") != 2 {
		t.Fatalf("NetworkUnavailable on the Nodes:\n%s", cond)
	}

	// Each node has its own host name, its Node's: a shell on it, its
	// kubelet and its containerd (whose hostNetwork pods share it) see it.
	for _, n := range s.Nodes {
		if out, err := s.NodeExec(ctx, n.Name, nil, "hostname"); err != nil || strings.TrimSpace(out) != n.Name {
			t.Errorf("hostname on %s: %q (%v), want %s", n.Name, strings.TrimSpace(out), err, n.Name)
		}
		for _, p := range s.Processes {
			if p.NS == n.NS && (p.Role == "kubelet" || p.Role == "containerd") {
				out, err := exec.Command("nsenter", "-t", fmt.Sprint(p.PID), "-u", "hostname").CombinedOutput()
				if err != nil || strings.TrimSpace(string(out)) != n.Name {
					t.Errorf("%s's %s sees the host name %q (%v), want %s", n.Name, p.Role, strings.TrimSpace(string(out)), err, n.Name)
				}
			}
		}
	}

	// kube-proxy set its conntrack timeouts, as on a real node, in the
	// node's namespace only (the machine's are checked at the end).
	for _, n := range s.Nodes {
		waitFor(t, 30*time.Second, n.Name+"'s TCP CLOSE_WAIT conntrack timeout at kube-proxy's 3600 s", func() bool {
			out, err := s.NodeExec(ctx, n.Name, nil, "cat", "/proc/sys/net/netfilter/nf_conntrack_tcp_timeout_close_wait")
			return err == nil && strings.TrimSpace(out) == "3600"
		})
	}

	// Each Node is in a zone of its own, as a cloud labels them.
	zones := kubectl("get", "nodes", "-o", `jsonpath={range .items[*]}{.metadata.name}={.metadata.labels.topology\.kubernetes\.io/zone}{"\n"}{end}`)
	for _, n := range s.Nodes {
		if !strings.Contains(zones, n.Name+"="+lab.NodeZone(n.Name)+"\n") {
			t.Errorf("Node zones:\n%s\nwant %s in %s", zones, n.Name, lab.NodeZone(n.Name))
		}
	}

	// node1's twill pod's own token (kubelet's projected one) can change
	// its own Node's twill annotations, and nothing of node2's.
	labNodeIsolation(t, s)

	// Pod to pod across nodes (TCP), node to pod, pod to ClusterIP
	// (kube-proxy), hostPort (twill's host-port table).
	l.checkAll(name)
	hostPortIsTwills(t, s)
	healthzPortIsTwilld(t, s)

	// crictl drives the node's containerd with the shipped conflist (the
	// ConfigMap's, equal to dist/10-twill.conflist: dist's tests hold them
	// the same) the way a CRI client other than kubelet would.
	crictlPod(t, s)

	// The conflist is twilld's to keep: a node whose CNI directory was
	// emptied gets it back, and new pods start there.
	node1 := s.Nodes[0].Name
	if out, err := s.NodeExec(ctx, node1, nil, "sh", "-c", "rm -f /etc/cni/net.d/*"); err != nil {
		t.Fatalf("emptying node1's /etc/cni/net.d: %v\n%s", err, out)
	}
	waitFor(t, 30*time.Second, "node1's conflist back", func() bool {
		out, err := s.NodeExec(ctx, node1, nil, "cat", "/etc/cni/net.d/10-twill.conflist")
		return err == nil && strings.Contains(out, `"type": "twill"`)
	})

	pods := podsByNode(s)
	a, b := pods[s.Nodes[0].Name][0], pods[s.Nodes[1].Name][0]
	p := startProber(t, s, a, netip.AddrPortFrom(b.IP, lab.EchoPort))

	// Deleting a pod frees its address and its host veth.
	victim := pods[s.Nodes[0].Name][1]
	route, err := s.NodeExec(ctx, node1, nil, "ip", "route", "show", victim.IP.String()+"/32")
	if err != nil || !strings.Contains(route, "dev tw") {
		t.Fatalf("route to the pod %s on node1: %v %q", victim.IP, err, route)
	}
	veth := strings.Fields(route[strings.Index(route, "dev ")+4:])[0]
	allocation := "/var/lib/cni/networks/twill/" + victim.IP.String()
	if _, err := s.NodeExec(ctx, node1, nil, "test", "-f", allocation); err != nil {
		t.Fatalf("no allocation record %s on node1", allocation)
	}
	kubectl("-n", "lab", "delete", "pod", victim.Name, "--wait=true")
	waitFor(t, 60*time.Second, "the deleted pod's address, veth and route released", func() bool {
		_, errAlloc := s.NodeExec(ctx, node1, nil, "test", "-e", allocation)
		_, errLink := s.NodeExec(ctx, node1, nil, "ip", "link", "show", veth)
		r, _ := s.NodeExec(ctx, node1, nil, "ip", "route", "show", victim.IP.String()+"/32")
		return errAlloc != nil && errLink != nil && strings.TrimSpace(r) == ""
	})

	// From here, every pod holds connections to every pod of the other
	// node and to the Service through each event: none may break.
	kubectl("-n", "lab", "rollout", "status", "deploy/echo", "--timeout", "2m")
	earlier := earlierBuild(t, s)
	d := startKubeDisruption(t, s, l.bin, backend)

	// The twill pod on node2 deleted: the DaemonSet makes another, and the
	// pods keep talking meanwhile (the data plane stays).
	d.event("twill pod deleted (node2)", false, func() {
		kubectl("-n", lab.TwillNamespace, "delete", "pod", twillPodOn(t, s, s.Nodes[1].Name), "--wait=true")
		waitTwillReady(t, s)
	})

	// A rolling update of the DaemonSet to a new image tag.
	d.event("rolling update of the DaemonSet", false, func() { rollTwill(t, s) })
	d.event("twilld kill -9 (node1), restarted by kubelet", false, func() { killTwilld(t, s, node1) })
	d.event("kube-apiserver restart", false, func() { restartControlPlane(t, s, "kube-apiserver") })
	d.event("etcd restart (the apiserver's)", false, func() { restartControlPlane(t, s, "etcd") })
	// Version skew: down to the previous round's build (its manifests and
	// image), then up again, one node after the other.
	d.event("downgrade to "+earlier.name, false, func() { earlier.install(t, s) })
	d.event("upgrade from it to this build", false, func() { thisBuild(s).install(t, s) })
	d.finish()
	gap, fails, total := p.stop()
	t.Logf("pod %s -> %s: %d probes over the pod delete and every event above; %d failed; longest gap %s",
		a.Label(), b.Label(), total, fails, gap.Round(time.Millisecond))
	if gap > time.Second {
		t.Errorf("pod-to-pod traffic stopped for %s while twill restarted; want no gap over 1s", gap)
	}

	// Everything still connects after the update.
	s, err = lab.Load(l.root, name)
	if err != nil {
		t.Fatal(err)
	}
	l.checkAll(name)

	if out, err := l.run("down", "--name", name); err != nil {
		t.Fatalf("lab down: %v\n%s", err, out)
	}
	l.requireGone(name)
	if after := snapshotHost(); !mapsEqual(before, after) {
		t.Errorf("the machine changed:\nbefore %v\nafter  %v", before, after)
	}
}

// labKubectl runs kubectl against the lab's apiserver and fails the test
// when it fails.
func labKubectl(t *testing.T, s *lab.State) func(args ...string) string {
	return func(args ...string) string {
		t.Helper()
		out, err := s.Kubectl(context.Background(), nil, args...)
		if err != nil {
			t.Fatalf("kubectl %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return out
	}
}

// labNodeIsolation takes the token kubelet mounted into node1's twill pod
// and patches Nodes with it: the admission policy shipped in
// dist/kube-twill.yml lets it change node1's twill annotations and
// NetworkUnavailable condition, and denies node2's annotations and either
// Node's status.addresses.
func labNodeIsolation(t *testing.T, s *lab.State) {
	t.Helper()
	ctx := context.Background()
	node1, node2 := s.Nodes[0].Name, s.Nodes[1].Name
	uid, err := s.Kubectl(ctx, nil, "-n", lab.TwillNamespace, "get", "pods", "--field-selector", "spec.nodeName="+node1,
		"-o", "jsonpath={.items[0].metadata.uid}")
	if err != nil || uid == "" {
		t.Fatalf("node1's twill pod: %v %q", err, uid)
	}
	tok, err := s.NodeExec(ctx, node1, nil, "sh", "-c", "cat /var/lib/kubelet/pods/"+uid+"/volumes/kubernetes.io~projected/*/token")
	if err != nil || tok == "" {
		t.Fatalf("node1's twill pod's token: %v %q", err, tok)
	}
	// As twilld patches: nodes/status, with no get first (the role grants
	// none on nodes/status).
	d := &net.Dialer{Timeout: 5 * time.Second}
	cfg := &rest.Config{Host: s.APIServer, BearerToken: tok, TLSClientConfig: rest.TLSClientConfig{CAFile: s.CAFile},
		Timeout: 30 * time.Second,
		Dial: func(ctx context.Context, network, addr string) (c net.Conn, err error) {
			err = ns.WithNetNSPath("/var/run/netns/"+s.UnderlayNS(), func(ns.NetNS) error {
				c, err = d.DialContext(ctx, network, addr)
				return err
			})
			return c, err
		}}
	nodes, err := corev1client.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	patch := func(node string, pt types.PatchType, body string) error {
		_, err := nodes.Nodes().Patch(ctx, node, pt, []byte(body), metav1.PatchOptions{}, "status")
		return err
	}
	addrs := `{"status":{"addresses":[{"type":"InternalIP","address":"10.99.0.250"}]}}`
	for _, d := range []struct{ what, node, body, want string }{
		{"node2's twill annotations", node2, `{"metadata":{"annotations":{"twill.io/public-ip":"10.99.0.250"}}}`, "may change only its own Node"},
		{"node2's status.addresses", node2, addrs, "may change only its own Node"},
		{"node1's status.addresses", node1, addrs, "may not change a Node's status.addresses"},
	} {
		if err := patch(d.node, types.MergePatchType, d.body); err == nil || !strings.Contains(err.Error(), "twill-node-isolation") || !strings.Contains(err.Error(), d.want) {
			t.Errorf("node1's twill token patching %s: %v; want it denied by twill-node-isolation with %q", d.what, err, d.want)
		}
	}
	if err := patch(node1, types.MergePatchType, `{"metadata":{"annotations":{"twill.io/token-test":"ok"}}}`); err != nil {
		t.Errorf("node1's twill token patching node1's twill annotations: %v", err)
	}
	cond := `{"status":{"conditions":[{"type":"NetworkUnavailable","status":"False","reason":"TwillIsUp","message":"token test"}]}}`
	if err := patch(node1, types.StrategicMergePatchType, cond); err != nil {
		t.Errorf("node1's twill token patching node1's NetworkUnavailable: %v", err)
	}
}

// crictlPod runs a pod sandbox and an echo container with crictl on the
// first node, reaches it over TCP from the second node, and checks that
// stopping and removing the sandbox releases its address.
func crictlPod(t *testing.T, s *lab.State) {
	t.Helper()
	ctx := context.Background()
	node := s.Nodes[0].Name
	dir := filepath.Join(s.Dir, node)
	pod := fmt.Sprintf(`{"metadata": {"name": "crictl", "namespace": "crictl", "uid": "crictl-1", "attempt": 0},
  "log_directory": "/var/log/crictl", "linux": {"cgroup_parent": "/%s/crictl"}}`, s.Nodes[0].NS)
	ctr := fmt.Sprintf(`{"metadata": {"name": "echo"}, "image": {"image": %q},
  "command": ["/usr/local/bin/twill-lab", "lab", "echo-server", "--port", "%d"], "log_path": "echo.log", "linux": {}}`, s.LabImage, lab.EchoPort)
	cfg := "runtime-endpoint: unix:///run/containerd/containerd.sock\nimage-endpoint: unix:///run/containerd/containerd.sock\ntimeout: 60\n"
	for f, content := range map[string]string{"crictl-pod.json": pod, "crictl-ctr.json": ctr, "crictl.yaml": cfg} {
		if err := os.WriteFile(filepath.Join(dir, f), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	crictl := func(args ...string) string {
		t.Helper()
		cmd, err := lab.ExecCommand(s, node, append([]string{filepath.Join(s.KubeBinDir, "crictl"), "--config", filepath.Join(dir, "crictl.yaml")}, args...))
		if err != nil {
			t.Fatal(err)
		}
		var stderr strings.Builder
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("crictl %s on %s: %v\n%s%s", strings.Join(args, " "), node, err, out, stderr.String())
		}
		return strings.TrimSpace(string(out))
	}
	defer holdKubelet(t, s, 0)()
	podID := crictl("runp", filepath.Join(dir, "crictl-pod.json"))
	ctrID := crictl("create", podID, filepath.Join(dir, "crictl-ctr.json"), filepath.Join(dir, "crictl-pod.json"))
	crictl("start", ctrID)
	ip, err := netip.ParseAddr(crictl("inspectp", "-o", "go-template", "--template", "{{.status.network.ip}}", podID))
	if err != nil || !netip.MustParsePrefix("10.244.0.0/16").Contains(ip) {
		t.Fatalf("crictl pod: address %v (%v), want one of twill's", ip, err)
	}
	from := []lab.Vantage{{Name: s.Nodes[1].Name, NetNS: "/var/run/netns/" + s.Nodes[1].NS}}
	to := []lab.Target{{Name: "crictl", Addr: netip.AddrPortFrom(ip, lab.EchoPort)}}
	var last lab.Result
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		if last = lab.Matrix(ctx, s.BinDir, from, to); last.Failed == 0 {
			break
		}
		if time.Now().Before(deadline) {
			continue
		}
		// Say why, so that a failure here explains itself.
		var diag strings.Builder
		for _, n := range s.Nodes[:2] {
			for _, args := range [][]string{{"ip", "route"}, {"ip", "neigh"}, {"ip", "-d", "link", "show", "type", "veth"}} {
				out, _ := s.NodeExec(ctx, n.Name, nil, args[0], args[1:]...)
				fmt.Fprintf(&diag, "--- %s: %s\n%s\n", n.Name, strings.Join(args, " "), out)
			}
		}
		fmt.Fprintf(&diag, "--- crictl ps -a\n%s\n--- echo log\n", crictl("ps", "-a"))
		if cmd, err := lab.ExecCommand(s, node, []string{"sh", "-c", "cat /var/log/crictl/echo.log"}); err == nil {
			out, _ := cmd.CombinedOutput()
			diag.Write(out)
		}
		t.Fatalf("the crictl pod at %s not reachable from %s within 30s: %v\n%s", ip, s.Nodes[1].Name, last.Errors, diag.String())
	}
	crictl("stopp", podID)
	crictl("rmp", podID)
	if _, err := s.NodeExec(ctx, node, nil, "test", "-e", "/var/lib/cni/networks/twill/"+ip.String()); err == nil {
		t.Errorf("crictl pod's address %s still allocated after stopp and rmp", ip)
	}
	t.Logf("crictl: pod %s wired by twill at %s, reached from %s, released", podID[:12], ip, s.Nodes[1].Name)
}

func mapsEqual(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

func waitTwillReady(t *testing.T, s *lab.State) {
	t.Helper()
	var why string
	waitFor(t, 3*time.Minute, "twill rolled out again", func() bool {
		var err error
		why, err = s.TwillReady(context.Background())
		return err == nil && why == ""
	})
}

// podsByNode groups the lab's echo pods by node.
func podsByNode(s *lab.State) map[string][]lab.Pod {
	m := map[string][]lab.Pod{}
	for _, p := range s.Pods {
		if strings.HasPrefix(p.Name, "echo-") {
			m[p.Node] = append(m[p.Node], p)
		}
	}
	return m
}

// prober connects from one pod to an echo server every 100ms, each
// connection made inside the pod's network namespace, and records when
// they succeeded.
type prober struct {
	done    chan struct{}
	stopped chan struct{}

	mu      sync.Mutex
	results []probeResult // guarded by mu
}

type probeResult struct {
	at   time.Time
	ok   bool
	took time.Duration
	err  error
}

func startProber(t *testing.T, s *lab.State, from lab.Pod, to netip.AddrPort) *prober {
	t.Helper()
	nsPath, err := lab.PodNetNS(s, from)
	if err != nil {
		t.Fatal(err)
	}
	return startProberIn(t, nsPath, to)
}

// startProberIn probes from the network namespace at nsPath.
func startProberIn(t *testing.T, nsPath string, to netip.AddrPort) *prober {
	t.Helper()
	// Hold the namespace open: /proc/<pid>/ns/net goes with its process.
	netns, err := ns.GetNS(nsPath)
	if err != nil {
		t.Fatal(err)
	}
	p := &prober{done: make(chan struct{}), stopped: make(chan struct{})}
	go func() {
		defer close(p.stopped)
		defer netns.Close()
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-p.done:
				return
			case <-tick.C:
			}
			at := time.Now()
			err := echoOnce(netns, to)
			p.mu.Lock()
			p.results = append(p.results, probeResult{at, err == nil, time.Since(at), err})
			p.mu.Unlock()
		}
	}()
	t.Cleanup(func() { p.stop() })
	return p
}

// stop ends probing and returns the longest time between two successful
// probes, the failures, and the number of probes.
func (p *prober) stop() (gap time.Duration, failed, total int) {
	select {
	case <-p.done:
	default:
		close(p.done)
	}
	<-p.stopped
	p.mu.Lock()
	defer p.mu.Unlock()
	var last time.Time
	for _, r := range p.results {
		if !r.ok {
			failed++
			continue
		}
		if !last.IsZero() {
			gap = max(gap, r.at.Sub(last))
		}
		last = r.at
	}
	if n := len(p.results); n > 0 && !p.results[n-1].ok && !last.IsZero() {
		gap = max(gap, p.results[n-1].at.Sub(last))
	}
	return gap, failed, len(p.results)
}

// timeline says, probe by probe, when it started (from since), how long
// it took and how it ended: what a failed gap assertion shows.
func (p *prober) timeline(since time.Time) string {
	p.mu.Lock()
	defer p.mu.Unlock()
	var b strings.Builder
	for _, r := range p.results {
		fmt.Fprintf(&b, "\n  %+8dms took %4dms", r.at.Sub(since).Milliseconds(), r.took.Milliseconds())
		if r.err != nil {
			fmt.Fprintf(&b, " %v", r.err)
		}
	}
	return b.String()
}

// failures lists when probes failed.
func (p *prober) failures() []time.Time {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []time.Time
	for _, r := range p.results {
		if !r.ok {
			out = append(out, r.at)
		}
	}
	return out
}

func echoOnce(netns ns.NetNS, to netip.AddrPort) error {
	var c net.Conn
	err := netns.Do(func(ns.NetNS) error {
		var err error
		c, err = net.DialTimeout("tcp", to.String(), 500*time.Millisecond)
		return err
	})
	if err != nil {
		return err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(500 * time.Millisecond))
	if _, err := io.WriteString(c, "ping\n"); err != nil {
		return err
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err == nil && line != "ping\n" {
		err = fmt.Errorf("echo %q", line)
	}
	return err
}

// TestKubeLabDownAfterKilledUp: lab up --kubernetes killed half-way (its
// nodes' roots, containerds and kubelets running), then lab down: no
// namespace, process, mount, cgroup or file of the lab is left, and the
// machine's paths and sysctls are as before.
func TestKubeLabDownAfterKilledUp(t *testing.T) {
	kubeLab(t)
	l := newLabCtl(t)
	before := snapshotHost()
	images := labImages(t, l.bin, kubeImages, "e2e")
	name := labName("kk")
	cmd := exec.Command(l.bin+"/twillctl", "lab", "up", "--name", name, "--state-root", l.root, "--kubernetes", "--nodes", "2",
		"--kube-bin-dir", kubeBinDir(t), "--image-dir", images)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = l.run("down", "--name", name) })
	// Until a kubelet runs: the state records it.
	waitFor(t, 90*time.Second, "a kubelet running in the lab", func() bool {
		s, err := lab.Load(l.root, name)
		if err != nil {
			return false
		}
		for _, p := range s.Processes {
			if p.Role == "kubelet" {
				return true
			}
		}
		return false
	})
	_ = cmd.Process.Signal(syscall.SIGKILL)
	_ = cmd.Wait()
	if out, err := l.run("down", "--name", name); err != nil {
		t.Fatalf("lab down after a killed lab up: %v\n%s", err, out)
	}
	l.requireGone(name)
	if after := snapshotHost(); !mapsEqual(before, after) {
		t.Errorf("the machine changed:\nbefore %v\nafter  %v", before, after)
	}
}

// holdKubelet stops node i's kubelet (SIGSTOP) until the returned function
// runs. kubelet's housekeeping (every 2 s) kills running pods it does not
// know, and a pod made with crictl is one: tests that drive containerd
// directly were killed mid-way now and then. A kubelet held for seconds
// is harmless (its Node has 40 s of grace before it is marked unready).
func holdKubelet(tb testing.TB, s *lab.State, i int) func() {
	tb.Helper()
	pid := 0
	for _, p := range s.Processes {
		if p.Role == "kubelet" && p.NS == s.Nodes[i].NS {
			pid = p.PID
		}
	}
	if pid == 0 {
		tb.Fatalf("no kubelet recorded for %s", s.Nodes[i].Name)
	}
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		tb.Fatal(err)
	}
	return func() {
		if err := syscall.Kill(pid, syscall.SIGCONT); err != nil {
			tb.Error(err)
		}
	}
}

// hostPortIsTwills checks that the hostPort pod's port is served by the
// twill plugin (the shipped conflist chains no portmap): its node's
// table inet twill-hostport maps it, and no portmap chain exists there.
// healthzPortIsTwilld tries to take twilld's port, 10267, from a tenant's
// namespace, as a hostPort (twill's host-port table would forward the
// node's port to the pod, kubelet's probes of twilld and the node's
// verdict readers with it): the scheduler places the pod on no node, as
// the shipped DaemonSet declares the port its own.
func healthzPortIsTwilld(t *testing.T, s *lab.State) {
	t.Helper()
	ctx := context.Background()
	pod := fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata: {name: squatter, namespace: lab}
spec:
  automountServiceAccountToken: false
  terminationGracePeriodSeconds: 1
  containers:
    - name: squatter
      image: %s
      ports: [{containerPort: 10267, hostPort: 10267}]
`, s.PauseImage)
	if out, err := s.Kubectl(ctx, strings.NewReader(pod), "apply", "-f", "-"); err != nil {
		t.Fatalf("creating a pod that asks for hostPort 10267: %v\n%s", err, out)
	}
	defer s.Kubectl(ctx, nil, "-n", "lab", "delete", "pod", "squatter", "--wait=true", "--ignore-not-found")
	waitFor(t, 60*time.Second, "the pod asking for hostPort 10267 held back by the scheduler", func() bool {
		out, _ := s.Kubectl(ctx, nil, "-n", "lab", "get", "pod", "squatter", "-o",
			`jsonpath={.spec.nodeName}/{.status.conditions[?(@.type=="PodScheduled")].reason}`)
		node, reason, _ := strings.Cut(strings.TrimSpace(out), "/")
		if node != "" {
			t.Fatalf("a tenant's pod asking for hostPort 10267 (twilld's) was placed on %s", node)
		}
		return reason == "Unschedulable"
	})
}

func hostPortIsTwills(t *testing.T, s *lab.State) {
	t.Helper()
	for _, p := range s.Pods {
		if !strings.HasPrefix(p.Name, "hostport") {
			continue
		}
		out, err := s.NodeExec(context.Background(), p.Node, nil, "nft", "list", "ruleset")
		if err != nil {
			t.Fatalf("nft list ruleset on %s: %v\n%s", p.Node, err, out)
		}
		if !strings.Contains(out, "table inet twill-hostport") || !strings.Contains(out, fmt.Sprintf("dport %d dnat", lab.HostPort)) {
			t.Errorf("%s's ruleset has no twill host port %d:\n%s", p.Node, lab.HostPort, out)
		}
		if strings.Contains(out, "CNI-HOSTPORT") || strings.Contains(out, "cni_hostport") {
			t.Errorf("%s's ruleset has portmap's chains:\n%s", p.Node, out)
		}
		return
	}
	t.Error("no hostport pod in the lab")
}
