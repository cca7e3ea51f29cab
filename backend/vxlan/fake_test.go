package vxlan

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/twill-net/twill/backend"
	"github.com/twill-net/twill/backend/backendtest"
	"github.com/twill-net/twill/nl"
	"github.com/twill-net/twill/nl/nlfake"
	"github.com/twill-net/twill/subnet"
)

// These tests run vxlan's Reconcile against nl/nlfake, a model
// of one namespace's kernel state, without root. They assert what the
// kernel holds afterwards, as ip and bridge would show it.

var _ Kernel = (*nlfake.Kernel)(nil)

// fnode is one node: a fake kernel with eth0, and the backend on it.
type fnode struct {
	k     *nlfake.Kernel
	eth   nl.Link
	state string
	conf  string
	b     *Backend
	nw    *Network
	log   strings.Builder
}

func newFNode(t testing.TB, backendJSON string) *fnode {
	t.Helper()
	return newFNodeIn(t, backendJSON, t.TempDir())
}

// newFNodeIn is newFNode with the state directory state, which may hold
// an earlier node's VTEP MAC (as after a restart).
func newFNodeIn(t testing.TB, backendJSON, state string) *fnode {
	t.Helper()
	k := &nlfake.Kernel{}
	eth := k.AddLink("eth0", 1500, true, netip.MustParsePrefix("192.168.1.1/24"))
	f := &fnode{k: k, eth: eth, state: state, conf: backendJSON}
	f.start(t)
	return f
}

// start builds the backend as a (re)starting twilld does.
func (f *fnode) start(t testing.TB) {
	t.Helper()
	opts := backendtest.Options(t, `{"Network":"10.244.0.0/16","Backend":`+f.conf+`}`, f.k, backend.ExternalInterface{Link: f.eth,
		Addr: netip.MustParseAddr("192.168.1.1"), PublicIP: netip.MustParseAddr("192.168.1.1"), OnLink: []netip.Prefix{netip.MustParsePrefix("192.168.1.0/24")}})
	opts.Logger, opts.StateDir = slog.New(slog.NewTextHandler(&f.log, nil)), f.state
	b, _, nw := backendtest.Attach(t, New, opts, "10.244.1.0/24")
	f.b, f.nw = b.(*Backend), nw.Network.(*Network)
}

// kernelState is what the kernel holds, by device name, in ip's words.
type kernelState struct {
	device                    string
	addrs, neigh, fdb, routes []string
}

func (s kernelState) String() string {
	return fmt.Sprintf("device %s\naddrs %q\nneigh %q\nfdb %q\nroutes %q", s.device, s.addrs, s.neigh, s.fdb, s.routes)
}

func (s kernelState) equal(o kernelState) bool {
	return s.String() == o.String()
}

func dump(t testing.TB, k *nlfake.Kernel) kernelState {
	t.Helper()
	var s kernelState
	links, _ := k.Links()
	names := map[int]string{}
	dev := -1
	for _, l := range links {
		names[l.Index] = l.Name
		if l.Name == "twill.1" {
			dev = l.Index
			_, v, _, _ := k.VXLANByName(l.Name)
			s.device = fmt.Sprintf("%s up=%v mtu %d vni %d port %d local %s dev %s", l.Name, l.Up, l.MTU, v.VNI, v.Port, v.SrcAddr, names[v.VtepDevIndex])
		}
	}
	if dev < 0 {
		return s
	}
	addrs, _ := k.Addrs(dev, nl.FamilyAll)
	for _, a := range addrs {
		s.addrs = append(s.addrs, a.Prefix.String())
	}
	ns, _ := k.Neighs(dev, nl.FamilyAll)
	for _, n := range ns {
		s.neigh = append(s.neigh, fmt.Sprintf("%s lladdr %s", n.IP, net.HardwareAddr(n.HardwareAddr)))
	}
	fdb, _ := k.FDB(dev)
	for _, n := range fdb {
		s.fdb = append(s.fdb, fmt.Sprintf("%s dst %s", net.HardwareAddr(n.HardwareAddr), n.IP))
	}
	rs, _ := k.Routes(nl.FamilyAll, nl.RouteFilter{})
	for _, r := range rs {
		line := r.Dst.String()
		if r.Gw.IsValid() {
			line += " via " + r.Gw.String()
		}
		line += " dev " + names[r.LinkIndex] + fmt.Sprintf(" proto %d", r.Protocol)
		if r.OnLink {
			line += " onlink"
		}
		s.routes = append(s.routes, line)
	}
	for _, l := range [][]string{s.addrs, s.neigh, s.fdb, s.routes} {
		slices.Sort(l)
	}
	return s
}

func has(t *testing.T, what string, got []string, want ...string) {
	t.Helper()
	for _, w := range want {
		if !slices.Contains(got, w) {
			t.Errorf("%s lacks %q: %q", what, w, got)
		}
	}
}

func lacks(t *testing.T, what string, got []string, sub string) {
	t.Helper()
	for _, g := range got {
		if strings.Contains(g, sub) {
			t.Errorf("%s still has %q: %q", what, sub, got)
		}
	}
}

func TestFakeReconcile(t *testing.T) {
	f := newFNode(t, `{"Type":"vxlan"}`)
	ctx := context.Background()
	peers := []subnet.Lease{lease("10.244.2.0/24", "10.0.0.2", "0a:00:00:00:00:02"), lease("10.244.3.0/24", "10.0.0.3", "0a:00:00:00:00:03")}
	if err := f.nw.Reconcile(ctx, peers); err != nil {
		t.Fatal(err)
	}
	s := dump(t, f.k)
	if s.device != "twill.1 up=true mtu 1450 vni 1 port 8472 local 192.168.1.1 dev eth0" {
		t.Errorf("device: %s", s.device)
	}
	has(t, "addrs", s.addrs, "10.244.1.0/32")
	has(t, "neigh", s.neigh, "10.244.2.0 lladdr 0a:00:00:00:00:02", "10.244.3.0 lladdr 0a:00:00:00:00:03")
	has(t, "fdb", s.fdb, "0a:00:00:00:00:02 dst 10.0.0.2", "0a:00:00:00:00:03 dst 10.0.0.3")
	has(t, "routes", s.routes, "10.244.2.0/24 via 10.244.2.0 dev twill.1 proto 167 onlink", "10.244.3.0/24 via 10.244.3.0 dev twill.1 proto 167 onlink")
	mac := net.HardwareAddr(f.b.dev.HardwareAddr).String()

	t.Run("peer changes VTEP MAC and public IP", func(t *testing.T) {
		peers[0] = lease("10.244.2.0/24", "10.0.0.22", "0a:00:00:00:00:22")
		if err := f.nw.Reconcile(ctx, peers); err != nil {
			t.Fatal(err)
		}
		s := dump(t, f.k)
		lacks(t, "fdb", s.fdb, "0a:00:00:00:00:02 ")
		has(t, "fdb", s.fdb, "0a:00:00:00:00:22 dst 10.0.0.22")
		has(t, "neigh", s.neigh, "10.244.2.0 lladdr 0a:00:00:00:00:22")
	})
	t.Run("peer removed", func(t *testing.T) {
		if err := f.nw.Reconcile(ctx, peers[1:]); err != nil {
			t.Fatal(err)
		}
		s := dump(t, f.k)
		for _, l := range [][]string{s.neigh, s.fdb, s.routes} {
			lacks(t, "kernel", l, "10.244.2.0")
			lacks(t, "kernel", l, "0a:00:00:00:00:22")
		}
	})
	t.Run("a peer with unusable data is refused and logged once", func(t *testing.T) {
		bad := lease("10.244.9.0/24", "10.0.0.9", "not-a-mac")
		for range 3 {
			if err := f.nw.Reconcile(ctx, append(slices.Clone(peers[1:]), bad)); err != nil {
				t.Fatal(err)
			}
		}
		s := dump(t, f.k)
		for _, l := range [][]string{s.neigh, s.fdb, s.routes} {
			lacks(t, "kernel", l, "10.244.9.0")
		}
		if n := strings.Count(f.log.String(), "refusing peers with unusable vxlan backend data"); n != 1 {
			t.Errorf("logged the refusal %d times, want once:\n%s", n, f.log.String())
		}
	})
	t.Run("device deleted by hand comes back with the same MAC and every peer", func(t *testing.T) {
		dev, _ := f.k.LinkByName("twill.1")
		if err := f.k.LinkDel(dev.Index); err != nil {
			t.Fatal(err)
		}
		if err := f.nw.Reconcile(ctx, peers[1:]); err != nil {
			t.Fatal(err)
		}
		s := dump(t, f.k)
		if l, _ := f.k.LinkByName("twill.1"); net.HardwareAddr(l.HardwareAddr).String() != mac {
			t.Errorf("device MAC %s, want %s", net.HardwareAddr(l.HardwareAddr), mac)
		}
		has(t, "fdb", s.fdb, "0a:00:00:00:00:03 dst 10.0.0.3")
		has(t, "neigh", s.neigh, "10.244.3.0 lladdr 0a:00:00:00:00:03")
		has(t, "routes", s.routes, "10.244.3.0/24 via 10.244.3.0 dev twill.1 proto 167 onlink")
		has(t, "addrs", s.addrs, "10.244.1.0/32")
	})
	t.Run("altered device is re-created", func(t *testing.T) {
		dev, _ := f.k.LinkByName("twill.1")
		f.k.SetMTU(dev.Index, 1300)
		if err := f.nw.Reconcile(ctx, peers[1:]); err != nil {
			t.Fatal(err)
		}
		s := dump(t, f.k)
		if !strings.Contains(s.device, "mtu 1450") {
			t.Errorf("device: %s", s.device)
		}
		has(t, "routes", s.routes, "10.244.3.0/24 via 10.244.3.0 dev twill.1 proto 167 onlink")
	})
	t.Run("drift names what is missing", func(t *testing.T) {
		gone := nl.Neigh{LinkIndex: f.nw.devIdx, IP: netip.MustParseAddr("10.244.3.0")}
		if err := f.k.NeighDel(gone, false); err != nil {
			t.Fatal(err)
		}
		d, err := f.nw.Drift(ctx, peers[1:])
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(strings.Join(d.Missing, "\n"), "10.244.3.0") {
			t.Errorf("drift %+v does not name the deleted neighbour", d)
		}
		f.nw.invalidate() // what a resync does
		if err := f.nw.Reconcile(ctx, peers[1:]); err != nil {
			t.Fatal(err)
		}
		if d, _ := f.nw.Drift(ctx, peers[1:]); len(d.Missing)+len(d.Wrong)+len(d.Extra) != 0 {
			t.Errorf("drift after a resync: %+v", d)
		}
	})
	t.Run("a restart keeps the MAC and changes nothing", func(t *testing.T) {
		before := dump(t, f.k)
		f.start(t)
		if got := net.HardwareAddr(f.b.dev.HardwareAddr).String(); got != mac {
			t.Fatalf("MAC after restart %s, was %s", got, mac)
		}
		if err := f.nw.Reconcile(ctx, peers[1:]); err != nil {
			t.Fatal(err)
		}
		if after := dump(t, f.k); !after.equal(before) {
			t.Errorf("a restart changed the kernel:\nbefore %s\nafter  %s", before, after)
		}
	})
}

func TestFakeDirectRouting(t *testing.T) {
	f := newFNode(t, `{"Type":"vxlan","DirectRouting":true}`)
	peers := []subnet.Lease{lease("10.244.2.0/24", "192.168.1.2", "0a:00:00:00:00:02"), lease("10.244.3.0/24", "10.0.0.3", "0a:00:00:00:00:03")}
	if err := f.nw.Reconcile(context.Background(), peers); err != nil {
		t.Fatal(err)
	}
	s := dump(t, f.k)
	has(t, "routes", s.routes, "10.244.2.0/24 via 192.168.1.2 dev eth0 proto 167", "10.244.3.0/24 via 10.244.3.0 dev twill.1 proto 167 onlink")
	lacks(t, "fdb", s.fdb, "192.168.1.2")
	lacks(t, "neigh", s.neigh, "10.244.2.0")

	// The external link flaps: its routes went with it (the kernel says
	// nothing), and twilld hands the backend the interface as it is now.
	f.k.SetUp(f.eth.Index, false)
	f.k.SetUp(f.eth.Index, true)
	f.nw.ExternalChanged(f.b.opts.ExtIface)
	if err := f.nw.Reconcile(context.Background(), peers); err != nil {
		t.Fatal(err)
	}
	has(t, "routes after a flap", dump(t, f.k).routes, "10.244.2.0/24 via 192.168.1.2 dev eth0 proto 167")
}

func TestFakeClonedMACTakesANewOne(t *testing.T) {
	f := newFNode(t, `{"Type":"vxlan"}`)
	own := net.HardwareAddr(f.b.dev.HardwareAddr).String()
	// A peer with a higher subnet publishing our MAC must pick another:
	// until it does, it is refused.
	higher := lease("10.244.2.0/24", "10.0.0.2", own)
	if err := f.nw.Reconcile(context.Background(), []subnet.Lease{higher}); err != nil {
		t.Fatal(err)
	}
	if s := dump(t, f.k); len(s.fdb)+len(s.neigh)+len(s.routes) != 0 {
		t.Fatalf("a peer with this node's MAC and a higher subnet was programmed:\n%s", s)
	}
	if _, _, ok := f.nw.BackendData(); ok {
		t.Fatal("this node changed its MAC although its subnet is the lower")
	}
	// A peer with a lower subnet keeps it: this node takes a new MAC,
	// publishes it, and programs the peer.
	peers := []subnet.Lease{lease("10.244.0.0/24", "10.0.0.2", own)}
	if err := f.nw.Reconcile(context.Background(), peers); err != nil {
		t.Fatal(err)
	}
	data, _, ok := f.nw.BackendData()
	if !ok {
		t.Fatal("no new backend data to publish after taking a new MAC")
	}
	var d Data
	if err := json.Unmarshal(data, &d); err != nil || d.VtepMAC == own {
		t.Fatalf("new backend data %s (%v): want a MAC other than %s", data, err, own)
	}
	if l, _ := f.k.LinkByName("twill.1"); net.HardwareAddr(l.HardwareAddr).String() != d.VtepMAC {
		t.Errorf("device MAC %s, published %s", net.HardwareAddr(l.HardwareAddr), d.VtepMAC)
	}
	has(t, "fdb", dump(t, f.k).fdb, own+" dst 10.0.0.2")
}

// peerPool is the peers the event sequences draw from: each event sets
// one peer to one of a few variants (absent, on-link or routed, one of a
// few MACs, shared or unusable backend data).
func peerVariant(i int, v byte) (subnet.Lease, bool) {
	if v%7 == 0 {
		return subnet.Lease{}, false // absent
	}
	pub := fmt.Sprintf("10.0.%d.%d", v%2, i+2)
	if v%3 == 0 {
		pub = fmt.Sprintf("192.168.1.%d", i+2) // on-link: direct with DirectRouting
	}
	mac := fmt.Sprintf("0a:00:00:00:%02x:%02x", v%4, i)
	switch v % 11 {
	case 5:
		mac = "0a:00:00:00:ff:ff" // shared by every peer drawing it
	case 9:
		mac = "garbage"
	}
	return lease(fmt.Sprintf("10.244.%d.0/24", i+2), pub, mac), true
}

// checkIncrementalIsFull drives one long-lived node through a sequence of
// lease events and, after each, compares its kernel with that of a fresh
// node given the same peers in one full reconcile.
//
// With viaUpdate, each step hands the long-lived node only what changed
// (Update, the daemon's path for a lease event), falling back to a full
// Reconcile when Update asks for one, as the daemon does.
func checkIncrementalIsFull(t testing.TB, conf string, events []byte, viaUpdate bool) {
	inc := newFNode(t, conf)
	// Each step's full reconcile starts from an empty kernel; the state
	// directory (the VTEP MAC, fsynced when first chosen) carries over.
	fullState := t.TempDir()
	peers := map[int]subnet.Lease{}
	for step := 0; step+1 < len(events); step += 2 {
		i, v := int(events[step]%12), events[step+1]
		var upserted, removed []subnet.Lease
		switch {
		case v == 255:
			inc.nw.invalidate() // a periodic resync
		default:
			old, had := peers[i]
			if l, ok := peerVariant(i, v); ok {
				peers[i] = l
				upserted = append(upserted, l)
			} else if had {
				delete(peers, i)
				removed = append(removed, old)
			}
		}
		list := make([]subnet.Lease, 0, len(peers))
		for _, l := range peers {
			list = append(list, l)
		}
		// The daemon's peer order is not stable; shuffle to say so.
		rand.Shuffle(len(list), func(a, b int) { list[a], list[b] = list[b], list[a] })
		err := backend.ErrFullReconcile
		if viaUpdate && step > 0 {
			err = inc.nw.Update(context.Background(), upserted, removed)
		}
		if errors.Is(err, backend.ErrFullReconcile) {
			err = inc.nw.Reconcile(context.Background(), list)
		}
		if err != nil {
			t.Fatalf("step %d: incremental path: %v", step/2, err)
		}
		full := newFNodeIn(t, conf, fullState)
		if err := full.nw.Reconcile(context.Background(), list); err != nil {
			t.Fatalf("step %d: full reconcile: %v", step/2, err)
		}
		if a, b := dump(t, inc.k), dump(t, full.k); !a.equal(b) {
			var desc []string
			for _, l := range list {
				desc = append(desc, fmt.Sprintf("%s pub %s data %s", l.Subnet, l.Attrs.PublicIP, l.Attrs.BackendData))
			}
			slices.Sort(desc)
			t.Fatalf("step %d (peer %d variant %d): the incremental path and a full reconcile disagree\npeers:\n%s\nincremental:\n%s\nfull:\n%s",
				step/2, i, v, strings.Join(desc, "\n"), a, b)
		}
	}
}

func TestIncrementalReconcileIsFull(t *testing.T) {
	for _, conf := range []string{`{"Type":"vxlan"}`, `{"Type":"vxlan","DirectRouting":true}`} {
		for seed := range uint64(40) {
			r := rand.New(rand.NewPCG(seed, 7))
			events := make([]byte, 60)
			for i := range events {
				events[i] = byte(r.Uint32())
			}
			t.Run(fmt.Sprintf("%s/seed%d", conf, seed), func(t *testing.T) { checkIncrementalIsFull(t, conf, events, false) })
			t.Run(fmt.Sprintf("%s/seed%d/update", conf, seed), func(t *testing.T) { checkIncrementalIsFull(t, conf, events, true) })
		}
	}
}

// TestReconcileLeavesTheCallersPeers: the daemon keeps its peer list
// after handing it over; screening it for shared MACs must not rewrite it.
func TestReconcileLeavesTheCallersPeers(t *testing.T) {
	f := newFNode(t, `{"Type":"vxlan"}`)
	peers := []subnet.Lease{
		lease("10.244.2.0/24", "10.0.0.2", "0a:00:00:00:00:aa"),
		lease("10.244.3.0/24", "10.0.0.3", "0a:00:00:00:00:aa"),
		lease("10.244.4.0/24", "10.0.0.4", "0a:00:00:00:00:04"),
	}
	before := slices.Clone(peers)
	if err := f.nw.Reconcile(context.Background(), peers); err != nil {
		t.Fatal(err)
	}
	for i := range peers {
		if peers[i].Subnet != before[i].Subnet {
			t.Fatalf("Reconcile rewrote the caller's peers: %v, was %v", peers, before)
		}
	}
}

func FuzzIncrementalReconcileIsFull(f *testing.F) {
	f.Add(false, []byte{0, 1, 1, 2, 0, 5, 0, 7, 2, 9, 1, 255, 1, 3})
	f.Add(true, []byte{0, 3, 1, 3, 0, 1, 1, 11, 2, 6, 2, 0})
	seed := make([]byte, 8)
	binary.LittleEndian.PutUint64(seed, 0x0102030405060708)
	f.Add(true, seed)
	f.Fuzz(func(t *testing.T, direct bool, events []byte) {
		viaUpdate := len(events) > 0 && events[0]%2 == 1
		if len(events) > 200 {
			events = events[:200]
		}
		conf := `{"Type":"vxlan"}`
		if direct {
			conf = `{"Type":"vxlan","DirectRouting":true}`
		}
		checkIncrementalIsFull(t, conf, events, viaUpdate)
	})
}
