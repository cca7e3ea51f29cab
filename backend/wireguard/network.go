package wireguard

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/netip"
	"sync"
	"time"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"

	"github.com/twill-net/twill/backend"
	"github.com/twill-net/twill/backend/kernelsync"
	"github.com/twill-net/twill/nl"
	"github.com/twill-net/twill/subnet"
)

// pollEvery is how often the devices are read back for hand-made changes:
// WireGuard sends no events for them.
const pollEvery = 2 * time.Second

// Network programs the peers of one lease.
type Network struct {
	b       *Backend
	local   subnet.Lease
	sh      shared
	routes  *kernelsync.RouteSync
	refused *kernelsync.RefusedPeers
	poll    time.Duration // how often the devices are read back
	nudge   func(netip.Addr)
	// opMu serializes the changes made to the devices: Reconcile's and
	// Update's, and followHandshakes'.
	opMu sync.Mutex
	// noPeersQuery: the devices whose last answer lacked the peers query
	// (guarded by opMu), so that the change is logged once each way.
	noPeersQuery map[string]bool

	mu sync.Mutex
	// guarded by mu:
	key  wgtypes.Key
	last map[string]*record // device name -> what was last applied to it
	// greeting holds, per device, the peers just added whose first
	// handshake is followed (see followHandshakes).
	greeting map[string]map[wgtypes.Key]greeting
	publish  bool   // the public key changed since it was published
	poke     func() // asks the daemon for a Reconcile (set by WatchKernel)
	// held is the private key each device was last seen to hold (set by
	// apply): a rotated key is published only once every device holds it.
	held map[string]wgtypes.Key
}

// The optional interfaces wireguard's Network implements.
var _ interface {
	backend.KernelWatcher
	backend.DriftReporter
	backend.DataPublisher
	backend.Runner
	backend.StatusReporter
} = (*Network)(nil)

func newNetwork(b *Backend, lease subnet.Lease, key wgtypes.Key) *Network {
	sh := shared{keepalive: b.s.keepalive}
	if b.s.psk != nil {
		sh.psk = *b.s.psk
	}
	return &Network{
		b: b, local: lease, sh: sh, key: key, last: map[string]*record{}, greeting: map[string]map[wgtypes.Key]greeting{},
		poll:    pollEvery,
		nudge:   sendNudge,
		routes:  &kernelsync.RouteSync{NL: b.devices.k, FullSyncEvery: b.opts.FullSyncEvery, WatchedSyncEvery: b.opts.WatchedSyncEvery, Log: b.log},
		refused: &kernelsync.RefusedPeers{Log: b.log, Message: "refusing peers with unusable wireguard backend data (no or a shared public key, no public IP of the tunnel's family)"},
	}
}

// MTU is the smallest of the devices' MTUs: pods of every family get one.
func (n *Network) MTU() int {
	m := 0
	for _, t := range n.b.tunnels {
		if m == 0 || t.mtu < m {
			m = t.mtu
		}
	}
	return m
}

// addrs are the addresses of t's device: the network address of each
// subnet it carries, as a host prefix, so that traffic the node itself
// sends to pods elsewhere leaves with an address peers route back here.
func (n *Network) addrs(t tunnel) []netip.Prefix {
	var out []netip.Prefix
	if t.pod4 && n.local.Subnet.IsValid() {
		out = append(out, netip.PrefixFrom(n.local.Subnet.Addr(), 32))
	}
	if t.pod6 && n.local.IPv6Subnet.IsValid() {
		out = append(out, netip.PrefixFrom(n.local.IPv6Subnet.Addr(), 128))
	}
	return out
}

// Reconcile makes every device's peers, and the routes through the
// devices, match peers.
func (n *Network) Reconcile(ctx context.Context, peers []subnet.Lease) error {
	n.opMu.Lock()
	defer n.opMu.Unlock()
	n.mu.Lock()
	key := n.key
	n.mu.Unlock()
	var (
		errs    []error
		rs      []nl.Route
		refused []string
		changed int
		nudges  []fresh
	)
	rs = failClosed(n.b.tunnels, n.b.opts.Config, rs)
	at := time.Now() // before any change: a handshake after it is one of this pass's peers
	for _, t := range n.b.tunnels {
		want, ref, conflicted := desired(t, key, peers)
		refused = append(refused, ref...)
		dev, link, err := n.b.devices.ensure(ctx, t, n.addrs(t))
		if err != nil {
			errs = append(errs, err)
			continue
		}
		routes(want, link.Index, func(r nl.Route) { rs = append(rs, r) })
		c, fresh, err := n.apply(ctx, t, dev, link.Index, key, want, conflicted)
		changed += c
		nudges = append(nudges, fresh...)
		if err != nil {
			errs = append(errs, err)
		}
	}
	n.refused.Report(refused)
	st, err := n.routes.Sync(func(emit func(nl.Route)) {
		for _, r := range rs {
			emit(r)
		}
	})
	if err != nil {
		errs = append(errs, err)
	}
	n.greet(nudges, at)
	n.b.opts.Metrics.AddDriftRepairs(st.Repaired)
	n.b.log.Debug("reconciled", "peers", len(peers), "device_changes", changed, "routes_added", st.Added, "routes_deleted", st.Deleted)
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("wireguard: %w", err)
	}
	return nil
}

// apply changes t's device to have key and want, reading the device back
// first: its peers are compared with the device as it is, not with a
// record, so a peer removed or altered by hand is put back. It returns the
// number of changes, and the device addresses of the peers it added (see
// sendNudge).
func (n *Network) apply(ctx context.Context, t tunnel, dev Device, link int, key wgtypes.Key, want map[wgtypes.Key]peer, conflicted map[string]wgtypes.Key) (int, []fresh, error) {
	have, err := dev.Get(ctx)
	if err != nil {
		return 0, nil, err
	}
	cfg, c := plan(have, key, t.port, want, n.sh)
	n.mu.Lock()
	prev := n.last[t.name]
	// rotating: the device was last seen with another key, which this
	// pass replaces: that change is a rotation, not drift.
	rotating := n.held[t.name] != key
	n.mu.Unlock()
	if c == 0 {
		n.record(t, want, link, conflicted, generation(ctx, dev))
		n.hold(t.name, key)
		return 0, nil, nil
	}
	if err := dev.Set(ctx, cfg); err != nil {
		n.hold(t.name, have.PrivateKey)
		return 0, nil, err
	}
	n.hold(t.name, key)
	var was map[wgtypes.Key]peer
	if prev != nil {
		was = prev.peers
		if !rotating && key == n.currentKey() && maps.EqualFunc(was, want, equalPeer) {
			n.b.opts.Metrics.AddDriftRepairs(c)
			n.b.log.Info("repaired WireGuard peers that had drifted", "device", t.name, "changes", c)
		}
	}
	n.record(t, want, link, conflicted, generation(ctx, dev))
	fresh := added(t, have, want)
	if have.PrivateKey != key && have.PrivateKey != (wgtypes.Key{}) {
		fresh = append(fresh, rekeyed(t, have, want)...)
	}
	return c, fresh, nil
}

// rekeyed lists the peers in want the device had already, when it has
// just taken a new key of its own (a rotation): WireGuard ended their
// sessions, and each needs a new handshake, which is followed as a new
// peer's is (see greet).
func rekeyed(t tunnel, have *wgtypes.Device, want map[wgtypes.Key]peer) []fresh {
	var out []fresh
	for _, p := range have.Peers {
		if w, ok := want[p.PublicKey]; ok && len(w.allowed) > 0 {
			out = append(out, fresh{dev: t.name, key: p.PublicKey, addr: w.allowed[0].Addr(), rekey: true})
		}
	}
	return out
}

// maxNudges bounds the nudges of one pass: a node's start in a large
// cluster adds every peer at once, and leaves the first handshakes to
// traffic (the peers nudge it as they add it).
const maxNudges = 64

// added lists the peers in want the device did not have: new peers, and
// peers that rotated their key (they route a prefix another key had; see
// greet); none when there are over maxNudges.
func added(t tunnel, have *wgtypes.Device, want map[wgtypes.Key]peer) []fresh {
	had := make(map[wgtypes.Key]bool, len(have.Peers))
	routed := map[netip.Prefix]bool{}
	for _, p := range have.Peers {
		had[p.PublicKey] = true
		for _, a := range p.AllowedIPs {
			routed[prefixOf(a)] = true
		}
	}
	var out []fresh
	for k, p := range want {
		if !had[k] && len(p.allowed) > 0 {
			out = append(out, fresh{dev: t.name, key: k, addr: p.allowed[0].Addr(), rotated: routed[p.allowed[0]]})
		}
	}
	if len(out) > maxNudges {
		return nil
	}
	return out
}

// sendNudge sends one datagram through the tunnel to a peer just added
// (or whose key changed). The peer may have sent us a handshake before we
// knew its key, and WireGuard waits 5s before it tries again; a packet
// from us makes our side start the handshake as soon as we know the key.
// Whichever of two nodes learns of the other last succeeds, and traffic
// flows both ways within a round trip (a node starting beside another, a
// key rotation).
func sendNudge(a netip.Addr) {
	c, err := net.DialUDP("udp", nil, net.UDPAddrFromAddrPort(netip.AddrPortFrom(a, 9))) // discard
	if err != nil {
		return
	}
	defer c.Close()
	_, _ = c.Write([]byte{0})
}

func (n *Network) currentKey() wgtypes.Key {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.key
}

// record is what was last applied to a device.
type record struct {
	peers  map[wgtypes.Key]peer
	leases map[string]wgtypes.Key // lease name -> its peer's key
	link   int
	// conflicted are the leases refused for a key they share, and
	// shared those keys (see desired).
	conflicted map[string]wgtypes.Key
	shared     map[wgtypes.Key]bool
	// gen is the device's generation after the last change twilld made
	// (0: it cannot tell, read it back).
	gen uint64
}

func (n *Network) record(t tunnel, want map[wgtypes.Key]peer, link int, conflicted map[string]wgtypes.Key, gen uint64) {
	r := &record{peers: want, leases: make(map[string]wgtypes.Key, len(want)), link: link, conflicted: conflicted,
		shared: map[wgtypes.Key]bool{}, gen: gen}
	for _, k := range conflicted {
		r.shared[k] = true
	}
	for k, p := range want {
		r.leases[p.lease] = k
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	n.last[t.name] = r
}

// hold records the private key device name holds.
func (n *Network) hold(name string, key wgtypes.Key) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.held == nil {
		n.held = map[string]wgtypes.Key{}
	}
	n.held[name] = key
}

// BackendData publishes the public key again once it changed (rotation)
// and every device holds the new private key: published before, the
// peers would drop this node's packets, sealed with the old key, until
// the device took it (a Reconcile under way when the key was rotated, or
// one that failed to set it).
func (n *Network) BackendData() (data, v6Data json.RawMessage, changed bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if !n.publish {
		return nil, nil, false
	}
	for _, t := range n.b.tunnels {
		if n.held[t.name] != n.key {
			return nil, nil, false // the next Reconcile sets it, then publishes
		}
	}
	n.publish = false
	data, v6Data = n.b.data(n.key.PublicKey())
	return data, v6Data, true
}

// Rotate replaces the node's key pair: the new private key is stored,
// then the devices take it at the next Reconcile (asked for here), and
// the new public key is published right after it.
func (n *Network) Rotate() error {
	k, err := n.b.keys.rotate()
	if err != nil {
		return err
	}
	n.mu.Lock()
	n.key, n.publish = k, true
	poke := n.poke
	n.mu.Unlock()
	n.b.log.Info("rotated the WireGuard key pair", "public_key", k.PublicKey().String())
	if poke != nil {
		poke()
	}
	return nil
}

// Run rotates the key pair every KeyRotationInterval, and whenever asked
// through Rotations (SIGUSR1 to twilld).
func (n *Network) Run(ctx context.Context) error {
	var tick <-chan time.Time
	if n.b.s.rotate > 0 {
		t := time.NewTicker(n.b.s.rotate)
		defer t.Stop()
		tick = t.C
	}
	asked := n.b.opts.KeyRotations
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick:
		case <-asked:
		}
		if err := n.Rotate(); err != nil {
			n.b.log.Error("rotating the WireGuard key pair failed; keeping the current one", "err", err)
		}
	}
}

// Status says, per device, how it is implemented and what it holds.
func (n *Network) Status(ctx context.Context) []string {
	key := n.currentKey()
	var out []string
	for _, t := range n.b.tunnels {
		impl := n.b.devices.Impl(t.name)
		if impl == "" {
			out = append(out, t.name+": MISSING")
			continue
		}
		what := impl + " WireGuard"
		if impl == ImplUserspace {
			what += " (twill-wg, socket " + Socket(n.b.opts.StateDir, t.name) + ")"
		}
		dev, err := n.b.devices.open(t.name, impl)
		var have *wgtypes.Device
		if err == nil {
			have, err = dev.Get(ctx)
		}
		if err != nil {
			out = append(out, fmt.Sprintf("%s: %s, unreadable: %v", t.name, what, err))
			continue
		}
		recent := 0
		for _, p := range have.Peers {
			if time.Since(p.LastHandshakeTime) < 3*time.Minute {
				recent++
			}
		}
		mine := "this node's key"
		if have.PrivateKey != key {
			mine = "NOT this node's stored key"
		}
		out = append(out, fmt.Sprintf("%s: %s, public key %s (%s), port %d, MTU %d, %d peers, %d with a handshake in the last 3 minutes",
			t.name, what, have.PublicKey, mine, have.ListenPort, t.mtu, len(have.Peers), recent))
	}
	return out
}
