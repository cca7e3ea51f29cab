package wireguard

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"sync"
	"testing"
	"time"

	"golang.zx2c4.com/wireguard/conn"
	"golang.zx2c4.com/wireguard/tun/tuntest"
	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"

	"github.com/twill-net/twill/backend/wireguard/uapi"
	"github.com/twill-net/twill/backend/wireguard/userspace"
	"github.com/twill-net/twill/nl/nlfake"
	"github.com/twill-net/twill/subnet"
)

// WireGuard's message types, the first byte of each datagram.
const (
	msgInitiation = 1
	msgResponse   = 2
	msgCookie     = 3
	msgData       = 4
)

// underlay carries the datagrams of in-process wireguard-go devices
// between their addresses, as a network would: each may be dropped or held
// back on its way, as cut says. It lets a test lose or reorder handshake
// messages at will, with WireGuard's real state machine at both ends.
type underlay struct {
	mu   sync.Mutex
	ends map[netip.AddrPort]*underlayBind // guarded by mu
	// cut, when set, decides each datagram's fate (guarded by mu).
	cut func(from, to netip.AddrPort, b []byte) (drop bool, delay time.Duration)
	// log, when set, takes the nodes' logs, wireguard-go's own included,
	// at debug level.
	log io.Writer
}

func (u *underlay) bind(addr netip.AddrPort) *underlayBind {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.ends == nil {
		u.ends = map[netip.AddrPort]*underlayBind{}
	}
	b := &underlayBind{u: u, addr: addr, rx: make(chan datagram, 4096)}
	u.ends[addr] = b
	return b
}

// setCut replaces cut.
func (u *underlay) setCut(cut func(from, to netip.AddrPort, b []byte) (bool, time.Duration)) {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.cut = cut
}

func (u *underlay) send(from, to netip.AddrPort, b []byte) {
	u.mu.Lock()
	dst, cut := u.ends[to], u.cut
	u.mu.Unlock()
	if dst == nil {
		return
	}
	var delay time.Duration
	if cut != nil {
		var drop bool
		if drop, delay = cut(from, to, b); drop {
			return
		}
	}
	d := datagram{b: append([]byte(nil), b...), from: from}
	if delay > 0 {
		time.AfterFunc(delay, func() { dst.deliver(d) })
		return
	}
	dst.deliver(d)
}

type datagram struct {
	b    []byte
	from netip.AddrPort
}

// underlayBind is one device's end of an underlay: a conn.Bind at a fixed
// address.
type underlayBind struct {
	u    *underlay
	addr netip.AddrPort
	rx   chan datagram

	mu     sync.Mutex
	closed chan struct{} // guarded by mu
}

var _ conn.Bind = (*underlayBind)(nil)

func (b *underlayBind) deliver(d datagram) {
	select {
	case b.rx <- d:
	default: // a full queue drops, as a socket's buffer does
	}
}

func (b *underlayBind) Open(uint16) ([]conn.ReceiveFunc, uint16, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	closed := make(chan struct{})
	b.closed = closed
	return []conn.ReceiveFunc{func(bufs [][]byte, sizes []int, eps []conn.Endpoint) (int, error) {
		select {
		case <-closed:
			return 0, net.ErrClosed
		case d := <-b.rx:
			sizes[0] = copy(bufs[0], d.b)
			eps[0] = &conn.StdNetEndpoint{AddrPort: d.from}
			return 1, nil
		}
	}}, b.addr.Port(), nil
}

func (b *underlayBind) Close() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed != nil {
		close(b.closed)
		b.closed = nil
	}
	return nil
}

func (b *underlayBind) Send(bufs [][]byte, ep conn.Endpoint) error {
	to := netip.AddrPortFrom(ep.DstIP(), 0)
	if se, ok := ep.(*conn.StdNetEndpoint); ok {
		to = se.AddrPort
	}
	for _, buf := range bufs {
		b.u.send(b.addr, to, buf)
	}
	return nil
}

func (b *underlayBind) ParseEndpoint(s string) (conn.Endpoint, error) {
	ap, err := netip.ParseAddrPort(s)
	if err != nil {
		return nil, err
	}
	return &conn.StdNetEndpoint{AddrPort: ap}, nil
}

func (b *underlayBind) SetMark(uint32) error { return nil }
func (b *underlayBind) BatchSize() int       { return 1 }

// wgNode is a node of a two-node cluster on an underlay: twill's wireguard
// backend over a fake kernel, driving a real wireguard-go device (twill-wg's
// code, on an in-memory TUN) whose datagrams cross the underlay. Its pod
// sends the other node's pod a packet every trafficEvery, and the arrivals
// from there are recorded.
type wgNode struct {
	name  string
	b     *Backend
	nw    *Network
	tun   *tuntest.ChannelTUN
	lease subnet.Lease
	pod   netip.Addr // its pod's address
	dev   *uapi.Client

	mu      sync.Mutex
	arrived []time.Time // guarded by mu: packets from the other node's pod
}

const trafficEvery = 20 * time.Millisecond

// newWGNode starts node i (1 or 2) on u: its device, served on a socket in
// its state directory, and its backend attached to its lease.
func newWGNode(t testing.TB, ctx context.Context, u *underlay, i int) *wgNode {
	t.Helper()
	state := t.TempDir()
	pub := netip.AddrFrom4([4]byte{192, 168, 1, byte(i)})
	n := &wgNode{name: "node" + string(rune('0'+i)), tun: tuntest.NewChannelTUN(),
		pod: netip.AddrFrom4([4]byte{10, 244, byte(i), 5})}
	var logW io.Writer = io.Discard
	verbose := u.log != nil
	if verbose {
		logW = u.log
	}
	log := slog.New(slog.NewTextHandler(logW, &slog.HandlerOptions{Level: slog.LevelDebug})).With("node", n.name)
	dctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	bind := u.bind(netip.AddrPortFrom(pub, DefaultListenPort))
	go func() {
		done <- userspace.Run(dctx, userspace.Options{Logger: log, Name: DeviceName, Socket: Socket(state, DeviceName),
			TUN: n.tun.TUN(), Bind: bind, Verbose: verbose})
	}()
	t.Cleanup(func() { cancel(); <-done })
	n.dev = &uapi.Client{Path: Socket(state, DeviceName)}
	deadline := time.Now().Add(10 * time.Second)
	for _, err := n.dev.Get(ctx); err != nil; _, err = n.dev.Get(ctx) {
		if time.Now().After(deadline) {
			t.Fatalf("%s: the device never served its socket", n.name)
		}
		time.Sleep(10 * time.Millisecond)
	}
	k := &nlfake.Kernel{NoWireGuard: true}
	k.AddTUN(DeviceName, 1420)
	o := options(t, k, conf(t, `{"Type":"wireguard","Mode":"auto"}`), state)
	o.Config.EnableIPv6 = false
	o.Logger = log
	o.ExtIface.Addr, o.ExtIface.PublicIP = pub, pub
	be, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	n.b = be.(*Backend)
	attrs, err := n.b.Prepare(ctx)
	if err != nil {
		t.Fatal(err)
	}
	n.lease = subnet.Lease{Subnet: netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 244, byte(i), 0}), 24), Attrs: attrs}
	n.lease.Attrs.PublicIP = pub
	nw, err := n.b.Attach(ctx, n.lease)
	if err != nil {
		t.Fatal(err)
	}
	n.nw = nw.Network.(*Network)
	self := n.lease.Subnet.Addr()
	n.nw.nudge = func(a netip.Addr) { n.write(ctx, tuntest.Ping(a, self)) }
	go n.receive(ctx)
	return n
}

// write hands the device a packet from this node, as the node's routing
// would.
func (n *wgNode) write(ctx context.Context, pkt []byte) {
	select {
	case n.tun.Outbound <- pkt:
	case <-ctx.Done():
	case <-time.After(time.Second):
	}
}

func (n *wgNode) receive(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case pkt, ok := <-n.tun.Inbound:
			if !ok {
				return
			}
			if len(pkt) >= 20 && pkt[15] == 5 { // from the other node's pod, not a nudge
				n.mu.Lock()
				n.arrived = append(n.arrived, time.Now())
				n.mu.Unlock()
			}
		}
	}
}

// sendTo sends a packet from this node's pod to to's every trafficEvery
// until ctx is done.
func (n *wgNode) sendTo(ctx context.Context, to *wgNode) {
	tk := time.NewTicker(trafficEvery)
	defer tk.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tk.C:
			n.write(ctx, tuntest.Ping(to.pod, n.pod))
		}
	}
}

// gap is the longest time from since to until without a packet from the
// other node's pod, and whether one came after since at all.
func (n *wgNode) gap(since, until time.Time) (time.Duration, bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	last, longest, any := since, time.Duration(0), false
	for _, at := range n.arrived {
		if at.Before(since) || at.After(until) {
			continue
		}
		any = true
		longest = max(longest, at.Sub(last))
		last = at
	}
	return max(longest, until.Sub(last)), any
}

// flowing reports whether a packet from the other node's pod came in the
// last 50ms.
func (n *wgNode) flowing() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return len(n.arrived) > 0 && time.Since(n.arrived[len(n.arrived)-1]) < 50*time.Millisecond
}

// publicKey is the key n's lease publishes.
func (n *wgNode) publicKey(t testing.TB) wgtypes.Key {
	t.Helper()
	var d Data
	if err := json.Unmarshal(n.lease.Attrs.BackendData, &d); err != nil {
		t.Fatal(err)
	}
	k, err := wgtypes.ParseKey(d.PublicKey)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// wgPair is two nodes on one underlay that know each other, their first
// handshakes followed, traffic flowing both ways.
func wgPair(t testing.TB, ctx context.Context, u *underlay) (n1, n2 *wgNode) {
	t.Helper()
	n1, n2 = newWGNode(t, ctx, u, 1), newWGNode(t, ctx, u, 2)
	for _, p := range [][2]*wgNode{{n1, n2}, {n2, n1}} {
		if err := p[0].nw.Reconcile(ctx, []subnet.Lease{p[1].lease}); err != nil {
			t.Fatal(err)
		}
	}
	for _, p := range [][2]*wgNode{{n1, n2}, {n2, n1}} {
		go func() { _ = p[0].nw.followHandshakes(ctx) }()
		go p[0].sendTo(ctx, p[1])
	}
	deadline := time.Now().Add(10 * time.Second)
	for !n1.flowing() || !n2.flowing() {
		if time.Now().After(deadline) {
			t.Fatal("the pods never reached each other")
		}
		time.Sleep(10 * time.Millisecond)
	}
	return n1, n2
}
