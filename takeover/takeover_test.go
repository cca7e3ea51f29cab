package takeover

import (
	"context"
	"errors"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/twill-net/twill/nl"
	"github.com/twill-net/twill/nl/nlfake"
	"github.com/twill-net/twill/testsupport/logtest"
)

var _ Kernel = (*nlfake.Kernel)(nil)

// fakeNetfilter models flannel's rules: chains that exist, and whether
// the built-in chains jump to them.
type fakeNetfilter struct {
	chains, hooked bool
	looks          int // Present calls: each is iptables execs
}

var _ Netfilter = (*fakeNetfilter)(nil)

func (f *fakeNetfilter) Present() (bool, error) { f.looks++; return f.chains, nil }
func (f *fakeNetfilter) Unhook() error          { f.hooked = false; return nil }
func (f *fakeNetfilter) Remove() error          { f.chains, f.hooked = false, false; return nil }

// node is a fake node as flannel (host-gw) leaves it: cni0 with one pod on
// it, a route to a peer, flannel's rules and subnet.env; twill has routed
// the peer since.
type node struct {
	k        *nlfake.Kernel
	nf       *fakeNetfilter
	env      string
	proxyARP []string
	tk       *Takeover
	pod      nl.Link
}

func newNode(t *testing.T) *node {
	t.Helper()
	n := &node{k: &nlfake.Kernel{}, nf: &fakeNetfilter{chains: true, hooked: true}, env: filepath.Join(t.TempDir(), "subnet.env")}
	if err := os.WriteFile(n.env, []byte("FLANNEL_SUBNET=10.50.1.1/24\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	eth := n.k.AddLink("eth0", 1500, true, netip.MustParsePrefix("192.168.1.1/24"))
	br := n.k.AddBridge("cni0", netip.MustParsePrefix("10.50.1.1/24"))
	n.pod = n.k.AddLink("veth1234", 1500, true)
	n.k.SetMaster(n.pod.Index, br.Index)
	peer := netip.MustParsePrefix("10.50.2.0/24")
	for _, r := range []nl.Route{
		{Dst: peer, Gw: netip.MustParseAddr("192.168.1.2"), LinkIndex: eth.Index, Protocol: protoBoot},
		{Dst: peer, Gw: netip.MustParseAddr("192.168.1.2"), LinkIndex: eth.Index, Protocol: nl.RouteProtocol, Priority: nl.RouteMetric(peer)},
		// flannel's route to a subnet twill does not route, and an
		// operator's route outside the cluster: neither is twill's to judge.
		{Dst: netip.MustParsePrefix("10.50.3.0/24"), Gw: netip.MustParseAddr("192.168.1.3"), LinkIndex: eth.Index, Protocol: protoBoot},
		{Dst: netip.MustParsePrefix("172.16.0.0/16"), Gw: netip.MustParseAddr("192.168.1.254"), LinkIndex: eth.Index, Protocol: protoBoot},
	} {
		if err := n.k.RouteReplace(r); err != nil {
			t.Fatal(err)
		}
	}
	n.tk = New(Options{Logger: slog.New(slog.DiscardHandler), Kernel: n.k, Netfilter: n.nf, SubnetFile: n.env,
		Networks:    []netip.Prefix{netip.MustParsePrefix("10.50.0.0/16")},
		SetProxyARP: func(l string) error { n.proxyARP = append(n.proxyARP, l); return nil }})
	return n
}

func (n *node) routes(t *testing.T) []string {
	t.Helper()
	rs, err := n.k.Routes(nl.FamilyAll, nl.RouteFilter{})
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, r := range rs {
		out = append(out, r.Dst.String()+" via "+r.Gw.String()+" proto "+itoa(r.Protocol))
	}
	slices.Sort(out)
	return out
}

func itoa(i int) string {
	if i == 0 {
		return "0"
	}
	var b []byte
	for ; i > 0; i /= 10 {
		b = append([]byte{byte('0' + i%10)}, b...)
	}
	return string(b)
}

func (n *node) link(name string) bool {
	_, err := n.k.LinkByName(name)
	return err == nil
}

func TestTakeOverWhilePodsRemainOnTheBridge(t *testing.T) {
	n := newNode(t)
	done, err := n.tk.Pass()
	if err != nil || done {
		t.Fatalf("first pass: done %v, %v; want not done while a pod is on cni0", done, err)
	}
	want := []string{"10.50.2.0/24 via 192.168.1.2 proto 167", "10.50.3.0/24 via 192.168.1.3 proto 3", "172.16.0.0/16 via 192.168.1.254 proto 3"}
	if got := n.routes(t); !slices.Equal(got, want) {
		t.Errorf("routes after the first pass:\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if !n.link("cni0") {
		t.Error("cni0 was removed while a pod is on it")
	}
	if _, err := os.Stat(n.env); err != nil {
		t.Errorf("flannel's subnet.env was removed while a pod is on cni0: %v", err)
	}
	if n.nf.hooked || !n.nf.chains {
		t.Errorf("flannel's chains: hooked %v, present %v; want unhooked, present", n.nf.hooked, n.nf.chains)
	}
	if !slices.Equal(n.proxyARP, []string{"cni0"}) {
		t.Errorf("proxy ARP set on %q, want cni0", n.proxyARP)
	}
	// The pod leaves (its DEL): the next pass removes all of flannel's.
	if err := n.k.LinkDel(n.pod.Index); err != nil {
		t.Fatal(err)
	}
	if done, err = n.tk.Pass(); err != nil || !done {
		t.Fatalf("pass after the last pod left: done %v, %v", done, err)
	}
	if n.link("cni0") {
		t.Error("cni0 is still there with no pod on it")
	}
	if _, err := os.Stat(n.env); !os.IsNotExist(err) {
		t.Errorf("flannel's subnet.env: %v, want it gone", err)
	}
	if n.nf.chains {
		t.Error("flannel's chains are still there")
	}
	if done, err = n.tk.Pass(); err != nil || !done {
		t.Fatalf("a node with nothing of flannel's: done %v, %v", done, err)
	}
}

// TestRulesLookedForOnce: while pods stay on the bridge, flannel's rules
// are not looked for again once found gone (flanneld is stopped).
func TestRulesLookedForOnce(t *testing.T) {
	n := newNode(t)
	n.nf.chains, n.nf.hooked = false, false
	for range 3 {
		if done, err := n.tk.Pass(); err != nil || done {
			t.Fatalf("done %v, %v; want not done while a pod is on cni0", done, err)
		}
	}
	if n.nf.looks != 1 {
		t.Errorf("flannel's rules looked for %d times in 3 passes, want once", n.nf.looks)
	}
}

func TestNoFlannelNoChange(t *testing.T) {
	k := &nlfake.Kernel{}
	// Bridges that are not flannel's: another name, and cni0 with no
	// address of the cluster's (someone else's, with no port).
	other := k.AddBridge("cni1", netip.MustParsePrefix("10.50.9.1/24"))
	cni0 := k.AddBridge("cni0", netip.MustParsePrefix("192.168.77.1/24"))
	nf := &fakeNetfilter{}
	tk := New(Options{Logger: slog.New(slog.DiscardHandler), Kernel: k, Netfilter: nf, SubnetFile: filepath.Join(t.TempDir(), "none"),
		Networks: []netip.Prefix{netip.MustParsePrefix("10.50.0.0/16")}})
	if done, err := tk.Pass(); err != nil || !done {
		t.Fatalf("done %v, %v", done, err)
	}
	for _, br := range []nl.Link{other, cni0} {
		if _, err := k.LinkByIndex(br.Index); err != nil {
			t.Errorf("%s, not flannel's, was removed: %v", br.Name, err)
		}
	}
}

func TestPlanFor(t *testing.T) {
	br := &nl.Link{Name: "cni0", Index: 3}
	for _, tc := range []struct {
		name     string
		s        State
		unhooked bool
		want     Plan
	}{
		{"nothing", State{}, false, Plan{}},
		{"pods on the bridge", State{Bridge: br, BridgePorts: 2, Netfilter: true}, false, Plan{ProxyARP: "cni0", Unhook: true}},
		{"already unhooked", State{Bridge: br, BridgePorts: 1, Netfilter: true}, true, Plan{ProxyARP: "cni0"}},
		{"empty bridge", State{Bridge: br, Netfilter: true}, true, Plan{Retire: true}},
		{"subnet.env only", State{SubnetFile: true}, false, Plan{Retire: true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := PlanFor(tc.s, tc.unhooked); got.ProxyARP != tc.want.ProxyARP || got.Unhook != tc.want.Unhook || got.Retire != tc.want.Retire {
				t.Errorf("got %+v, want %+v", got, tc.want)
			}
		})
	}
}

// TestRetireLeavesAForeignBridge: flannel's subnet.env alone is retired;
// a cni0 that holds none of the cluster's addresses is not flannel's and
// stays.
func TestRetireLeavesAForeignBridge(t *testing.T) {
	k := &nlfake.Kernel{}
	cni0 := k.AddBridge("cni0", netip.MustParsePrefix("192.168.77.1/24"))
	env := filepath.Join(t.TempDir(), "subnet.env")
	if err := os.WriteFile(env, []byte("FLANNEL_SUBNET=10.50.1.1/24\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	tk := New(Options{Logger: slog.New(slog.DiscardHandler), Kernel: k, Netfilter: &fakeNetfilter{}, SubnetFile: env,
		Networks: []netip.Prefix{netip.MustParsePrefix("10.50.0.0/16")}})
	if done, err := tk.Pass(); err != nil || !done {
		t.Fatalf("done %v, %v", done, err)
	}
	if _, err := os.Stat(env); !os.IsNotExist(err) {
		t.Errorf("flannel's subnet.env: %v, want it gone", err)
	}
	if _, err := k.LinkByIndex(cni0.Index); err != nil {
		t.Errorf("a cni0 that is not flannel's was removed at retirement: %v", err)
	}
}

// failingNetfilter refuses to remove flannel's rules a number of times.
type failingNetfilter struct {
	fakeNetfilter
	fails int
}

func (f *failingNetfilter) Remove() error {
	if f.fails > 0 {
		f.fails--
		return errors.New("iptables: resource busy")
	}
	return f.fakeNetfilter.Remove()
}

// Run passes until nothing of flannel's is left: while a pod stays on the
// bridge, and through a removal that fails twice (warned once), then
// returns; cancelled, it returns at once.
func TestRunUntilFlannelIsGone(t *testing.T) {
	n := newNode(t)
	var logs logtest.Buffer
	nf := &failingNetfilter{fakeNetfilter: fakeNetfilter{chains: true, hooked: true}, fails: 2}
	n.tk.o.Netfilter, n.tk.o.Every = nf, time.Millisecond
	n.tk.o.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	done := make(chan error, 1)
	go func() { done <- n.tk.Run(context.Background()) }()
	select {
	case err := <-done:
		t.Fatalf("Run returned (%v) while a pod is on cni0", err)
	case <-time.After(50 * time.Millisecond):
	}
	if err := n.k.LinkDel(n.pod.Index); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return within 10 s of the last pod leaving")
	}
	if n.link("cni0") || nf.chains {
		t.Errorf("after Run: cni0 there %v, flannel's chains there %v; want both gone", n.link("cni0"), nf.chains)
	}
	if got := strings.Count(logs.String(), "resource busy"); got != 1 {
		t.Errorf("the failed removal warned %d times, want once:\n%s", got, logs.String())
	}

	again := newNode(t)
	ctx, cancel := context.WithCancel(context.Background())
	go func() { done <- again.tk.Run(ctx) }()
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return within 10 s of its context's end")
	}
}
