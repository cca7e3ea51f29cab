package e2e

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/twill-net/twill/lab"
)

// TestKubeLabIPFamilies runs the Kubernetes lab in the other two IP
// families, under real kubelets, containerds and kube-proxies: dual-stack
// on host-gw and IPv6-only on vxlan (the dual-stack vxlan lab is
// TestKubeConformanceFast's). For each it checks what an operator would:
// every Node has a pod subnet of each family, every pod an address of each,
// lab check connects pod to pod, node to pod, to the Service and to the
// hostPort in every family, CoreDNS answers for the Service with an address
// of each family, and lab down leaves the machine as it was.
func TestKubeLabIPFamilies(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ backend, family string }{{"host-gw", "dual"}, {"vxlan", "ipv6"}} {
		t.Run(tc.backend+"/"+tc.family, func(t *testing.T) {
			kubeLab(t)
			testKubeLabIPFamily(t, tc.backend, tc.family)
		})
	}
}

func testKubeLabIPFamily(t *testing.T, backend, family string) {
	l := newLabCtl(t)
	before := snapshotHost()
	name := labName("f" + family[:1] + backend[:1])
	s := l.upKube(name, 2, 1, backend, "--ip-family", family)
	kubectl := labKubectl(t, s)
	ctx := context.Background()
	want := map[string][]bool{"dual": {true, true}, "ipv6": {false, true}}[family] // IPv4, IPv6
	nFamilies := map[string]int{"dual": 2, "ipv6": 1}[family]

	// Each Node has a pod subnet per family; each pod an address per family.
	cidrs := kubectl("get", "nodes", "-o", `jsonpath={range .items[*]}{.metadata.name}={.spec.podCIDRs}{"\n"}{end}`)
	for _, line := range strings.Split(strings.TrimSpace(cidrs), "\n") {
		if got := families(t, line); !slices.Equal(got, want) {
			t.Errorf("Node podCIDRs %s: families (IPv4, IPv6) %v, want %v", line, got, want)
		}
	}
	ips := kubectl("-n", "lab", "get", "pods", "-o", `jsonpath={range .items[*]}{.metadata.name}={.status.podIPs}{"\n"}{end}`)
	for _, line := range strings.Split(strings.TrimSpace(ips), "\n") {
		if got := families(t, line); !slices.Equal(got, want) {
			t.Errorf("pod IPs %s: families (IPv4, IPv6) %v, want %v", line, got, want)
		}
	}

	// Every pair in every family: pods, nodes, the Service, the hostPort.
	l.checkAll(name)

	// CoreDNS answers for the lab's (PreferDualStack) Service with its
	// ClusterIP of each family, asked from a node at the cluster DNS.
	svcIPs := strings.Fields(kubectl("-n", "lab", "get", "service", "echo", "-o", `jsonpath={.spec.clusterIPs[*]}`))
	dns := strings.TrimSpace(kubectl("-n", "kube-system", "get", "service", "kube-dns", "-o", `jsonpath={.spec.clusterIP}`))
	var got []string
	waitFor(t, 30*time.Second, "CoreDNS to answer for echo.lab.svc.cluster.local with "+strings.Join(svcIPs, " and "), func() bool {
		addrs, err := lookupIn("/var/run/netns/"+s.Nodes[0].NS, netip.MustParseAddr(dns), "echo.lab.svc.cluster.local")
		got = nil
		for _, a := range addrs {
			got = append(got, a.String())
		}
		slices.Sort(got)
		slices.Sort(svcIPs)
		if err != nil {
			t.Logf("DNS: %v", err)
		}
		return len(svcIPs) == nFamilies && slices.Equal(got, svcIPs)
	})

	// Pod traffic leaving the cluster network is masqueraded in each
	// family (the DaemonSet's --ip-masq): a server in the underlay, off
	// the cluster, sees node1's address of that family, not the pod's.
	if err := s.RefreshPods(ctx); err != nil {
		t.Fatal(err)
	}
	pod := podsByNode(s)[s.Nodes[0].Name][0]
	podNS, err := lab.PodNetNS(s, pod)
	if err != nil {
		t.Fatal(err)
	}
	for _, server := range globalAddrs(t, s.UnderlayNS(), "br0") {
		seen := echoIn(t, "/var/run/netns/"+s.UnderlayNS(), netip.AddrPortFrom(server, 7070))
		r := lab.Matrix(ctx, l.bin, []lab.Vantage{{Name: pod.Label(), NetNS: podNS}}, []lab.Target{{Name: "outside", Addr: netip.AddrPortFrom(server, 7070)}})
		if r.Failed > 0 {
			t.Fatalf("pod %s to %s, off the cluster: %v", pod.Label(), server, r.Errors)
		}
		want := s.Nodes[0].Addr
		if server.Is6() {
			want = s.Nodes[0].AddrV6
		}
		if got := <-seen; got != want {
			t.Errorf("pod %s (%v) to %s arrived from %s, want node1's %s (masqueraded)", pod.Label(), pod.Addrs(), server, got, want)
		}
	}

	if out, err := l.run("down", "--name", name); err != nil {
		t.Fatalf("lab down: %v\n%s", err, out)
	}
	l.requireGone(name)
	if after := snapshotHost(); !mapsEqual(before, after) {
		t.Errorf("the machine changed:\nbefore %v\nafter  %v", before, after)
	}
}

// families says which families a line's addresses are of: (IPv4, IPv6).
func families(t *testing.T, line string) []bool {
	t.Helper()
	out := []bool{false, false}
	for _, f := range strings.FieldsFunc(line, func(r rune) bool { return strings.ContainsRune(`=[]{}," `, r) }) {
		f = strings.TrimPrefix(f, "ip:")
		if p, err := netip.ParsePrefix(f); err == nil {
			f = p.Addr().String()
		}
		if a, err := netip.ParseAddr(f); err == nil && a.Is4() {
			out[0] = true
		} else if err == nil {
			out[1] = true
		}
	}
	return out
}

// lookupIn resolves name (A and AAAA) at the DNS server dns, from inside
// the network namespace at nsPath.
func lookupIn(nsPath string, dns netip.Addr, name string) ([]netip.Addr, error) {
	netns, err := ns.GetNS(nsPath)
	if err != nil {
		return nil, err
	}
	defer netns.Close()
	r := &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, network, _ string) (net.Conn, error) {
		// The socket is made on a thread in the namespace, and stays
		// there.
		var c net.Conn
		err := netns.Do(func(ns.NetNS) error {
			var err error
			c, err = (&net.Dialer{Timeout: 2 * time.Second}).DialContext(ctx, network, netip.AddrPortFrom(dns, 53).String())
			return err
		})
		return c, err
	}}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	addrs, err := r.LookupNetIP(ctx, "ip", name)
	if err != nil {
		return nil, fmt.Errorf("resolving %s at %s: %w", name, dns, err)
	}
	for i, a := range addrs {
		addrs[i] = a.Unmap()
	}
	return addrs, nil
}

// globalAddrs are the global addresses of a device in a namespace.
func globalAddrs(t *testing.T, nsName, dev string) []netip.Addr {
	t.Helper()
	out, err := exec.Command("ip", "-n", nsName, "-o", "addr", "show", "dev", dev, "scope", "global").CombinedOutput()
	if err != nil {
		t.Fatalf("ip addr show %s in %s: %v\n%s", dev, nsName, err, out)
	}
	var addrs []netip.Addr
	for _, line := range strings.Split(string(out), "\n") {
		if f := strings.Fields(line); len(f) > 3 {
			if p, err := netip.ParsePrefix(f[3]); err == nil {
				addrs = append(addrs, p.Addr())
			}
		}
	}
	return addrs
}

// echoIn serves one echo connection (a line back, as a lab pod's echo
// server does) on addr in the namespace at nsPath, and sends the address it
// came from.
func echoIn(t *testing.T, nsPath string, addr netip.AddrPort) <-chan netip.Addr {
	t.Helper()
	netns, err := ns.GetNS(nsPath)
	if err != nil {
		t.Fatal(err)
	}
	defer netns.Close()
	var l net.Listener
	if err := netns.Do(func(ns.NetNS) error {
		l, err = net.Listen("tcp", addr.String())
		return err
	}); err != nil {
		t.Fatalf("listening on %s in %s: %v", addr, nsPath, err)
	}
	t.Cleanup(func() { l.Close() })
	seen := make(chan netip.Addr, 1)
	go func() {
		c, err := l.Accept()
		if err != nil {
			seen <- netip.Addr{}
			return
		}
		defer c.Close()
		seen <- c.RemoteAddr().(*net.TCPAddr).AddrPort().Addr().Unmap()
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
		if line, err := bufio.NewReader(c).ReadString('\n'); err == nil {
			_, _ = io.WriteString(c, line)
		}
	}()
	return seen
}
