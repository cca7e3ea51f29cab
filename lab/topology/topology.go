// Package topology builds simulated clusters out of network namespaces: an
// underlay namespace holding a bridge, node namespaces whose eth0 is a veth
// on that bridge, and pod namespaces behind nodes. The e2e tests, the
// benchmarks and the lab use it. It only ever creates namespaces under the
// caller's name prefix and never changes the namespace it runs in.
package topology

import (
	"errors"
	"fmt"
	"net/netip"
	"os/exec"
	"strings"
	"sync"

	"github.com/twill-net/twill/internal/sysctl"
)

// Options describe the cluster to build.
type Options struct {
	// Prefix starts every namespace name; it must be unique per run.
	Prefix string
	Nodes  int
	// Underlay is the nodes' L2 segment; nodes get .1, .2, ... and the
	// underlay namespace's bridge the last usable address.
	Underlay netip.Prefix
	// MTU of the underlay links; 0 keeps the default (1500).
	MTU int
	// UnderlayV6, when set (a /64), gives node i address ::i on eth0 and
	// the bridge ::fe: a dual-stack underlay with Underlay, an IPv6-only
	// one without it.
	UnderlayV6 netip.Prefix
	// Routed puts the nodes on two segments joined by a router namespace:
	// odd nodes on Underlay (a /24) and UnderlayV6, even nodes on the next
	// /24 and /64. Nodes and the underlay namespace route to the other
	// segment via the router (.253 and ::fd on each segment), so only L3
	// crosses between segments.
	Routed bool
	// VPC, when set, makes a simulated cloud VPC instead of a bridge: see
	// VPCOptions. Underlay is then the nodes' primary subnet.
	VPC *VPCOptions
	// DefaultRoute gives nodes on a flat underlay a default route via the
	// underlay namespace's bridge address, as real hosts have one (twilld
	// finds its interface by it when --iface is not given).
	DefaultRoute bool
}

// Topology is a built cluster.
type Topology struct {
	Underlay string // namespace holding the (first) bridge
	// BridgeAddr is reachable from every node (etcd listens here): the
	// bridge's IPv4 address, or its IPv6 one on an IPv6-only underlay.
	BridgeAddr netip.Addr
	Nodes      []Node
	// Router is the router namespace of a routed topology; UnderlayB the
	// second segment's namespace.
	Router    string
	UnderlayB string

	mu      sync.Mutex
	created []string // guarded by mu; namespaces to delete, in creation order
}

// Node is a simulated host.
type Node struct {
	Name string
	NS   string
	// Addr is eth0's address with the underlay prefix length: IPv4, or
	// IPv6 on an IPv6-only underlay. AddrV6 is its IPv6 one, if any.
	Addr, AddrV6 netip.Prefix
	// ENIAddr and ENIMAC describe eth1, the node's ENI, in a VPC topology.
	ENIAddr netip.Prefix
	ENIMAC  string
}

// IP runs `ip -n ns args...`.
func IP(ns string, args ...string) error {
	out, err := exec.Command("ip", append([]string{"-n", ns}, args...)...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ip -n %s %s: %w: %s", ns, strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// Exec runs a command inside ns and returns its combined output.
func Exec(ns, name string, args ...string) (string, error) {
	out, err := exec.Command("ip", append([]string{"netns", "exec", ns, name}, args...)...).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("in %s: %s %s: %w: %s", ns, name, strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return string(out), nil
}

// Build creates the cluster. On failure it removes what it created.
func Build(o Options) (_ *Topology, err error) {
	if o.Nodes < 1 || o.Nodes > 200 {
		return nil, fmt.Errorf("topology: %d nodes: want 1..200", o.Nodes)
	}
	if !o.Underlay.IsValid() && !o.UnderlayV6.IsValid() {
		return nil, errors.New("topology: no underlay: set Underlay (IPv4), UnderlayV6, or both")
	}
	if o.Underlay.IsValid() && (o.Underlay.Addr().Is6() || o.Underlay.Bits() > 24) {
		return nil, fmt.Errorf("topology: underlay %s: want an IPv4 /24 or larger", o.Underlay)
	}
	if o.UnderlayV6.IsValid() && (!o.UnderlayV6.Addr().Is6() || o.UnderlayV6.Bits() != 64) {
		return nil, fmt.Errorf("topology: IPv6 underlay %s: want an IPv6 /64", o.UnderlayV6)
	}
	if o.Routed && o.Underlay.IsValid() && o.Underlay.Bits() != 24 {
		return nil, fmt.Errorf("topology: routed underlay %s: want a /24", o.Underlay)
	}
	t := &Topology{Underlay: o.Prefix + "-ul"}
	defer func() {
		if err != nil {
			err = errors.Join(err, t.Destroy())
		}
	}()
	if err := t.addNS(t.Underlay); err != nil {
		return nil, err
	}
	if o.VPC != nil {
		if err := t.buildVPC(o); err != nil {
			return nil, err
		}
		return t, nil
	}
	steps := [][]string{{"link", "add", "br0", "type", "bridge"}, {"link", "set", "br0", "up"}}
	if o.Underlay.IsValid() {
		t.BridgeAddr = lastUsable(o.Underlay)
		steps = append(steps, []string{"addr", "add", netip.PrefixFrom(t.BridgeAddr, o.Underlay.Bits()).String(), "dev", "br0"})
	}
	if o.UnderlayV6.IsValid() {
		a := hostV6(o.UnderlayV6, bridgeV6)
		if !t.BridgeAddr.IsValid() {
			t.BridgeAddr = a
		}
		steps = append(steps, []string{"-6", "addr", "add", netip.PrefixFrom(a, 64).String(), "dev", "br0", "nodad"})
	}
	for _, s := range steps {
		if err := IP(t.Underlay, s...); err != nil {
			return nil, err
		}
	}
	segments := []*segment{{ns: t.Underlay, prefix: o.Underlay, prefix6: o.UnderlayV6, next: o.Underlay.Addr()}}
	if o.Routed {
		segB, err := t.buildRouter(o)
		if err != nil {
			return nil, err
		}
		segments = append(segments, segB)
	}
	for i := 1; i <= o.Nodes; i++ {
		if err := t.addNode(o, i, segments[(i-1)%len(segments)]); err != nil {
			return nil, err
		}
	}
	return t, nil
}

// segment is one L2 segment of the underlay: a bridge in namespace ns.
type segment struct {
	ns      string
	prefix  netip.Prefix // IPv4; invalid on an IPv6-only underlay
	prefix6 netip.Prefix // IPv6; invalid on an IPv4-only underlay
	next    netip.Addr   // the last IPv4 address given to a node
}

// The host parts of the IPv6 underlay's fixed addresses.
const (
	bridgeV6 = 0xfe
	routerV6 = 0xfd
)

// hostV6 is address host (below 256) in a /64.
func hostV6(p netip.Prefix, host byte) netip.Addr {
	a := p.Masked().Addr().As16()
	a[15] = host
	return netip.AddrFrom16(a)
}

// nextV6 is the /64 after p.
func nextV6(p netip.Prefix) netip.Prefix {
	a := p.Masked().Addr().As16()
	v := uint16(a[6])<<8 | uint16(a[7]) + 1
	a[6], a[7] = byte(v>>8), byte(v)
	return netip.PrefixFrom(netip.AddrFrom16(a), 64)
}

// buildRouter adds a second segment and a router between the two; the
// first underlay namespace (where etcd listens) reaches the second
// segment through it.
func (t *Topology) buildRouter(o Options) (*segment, error) {
	segB := &segment{ns: o.Prefix + "-ulb"}
	if o.Underlay.IsValid() {
		a4 := o.Underlay.Addr().As4()
		a4[2]++
		segB.prefix = netip.PrefixFrom(netip.AddrFrom4(a4), 24)
		segB.next = segB.prefix.Addr()
	}
	if o.UnderlayV6.IsValid() {
		segB.prefix6 = nextV6(o.UnderlayV6)
	}
	t.UnderlayB, t.Router = segB.ns, o.Prefix+"-rt"
	for _, ns := range []string{t.UnderlayB, t.Router} {
		if err := t.addNS(ns); err != nil {
			return nil, err
		}
	}
	for _, st := range [][]string{{"link", "add", "br0", "type", "bridge"}, {"link", "set", "br0", "up"}} {
		if err := IP(t.UnderlayB, st...); err != nil {
			return nil, err
		}
	}
	segs := []segment{{ns: t.Underlay, prefix: o.Underlay, prefix6: o.UnderlayV6}, *segB}
	for i, seg := range segs {
		port, dev := fmt.Sprintf("rt%d", i), fmt.Sprintf("seg%d", i)
		steps := []nsStep{
			{t.Router, []string{"link", "add", dev, "type", "veth", "peer", "name", port, "netns", seg.ns}},
			{t.Router, []string{"link", "set", dev, "up"}},
			{seg.ns, []string{"link", "set", port, "master", "br0"}},
			{seg.ns, []string{"link", "set", port, "up"}},
		}
		if seg.prefix.IsValid() {
			steps = append(steps, nsStep{t.Router, []string{"addr", "add", netip.PrefixFrom(routerV4(seg.prefix), 24).String(), "dev", dev}})
		}
		if seg.prefix6.IsValid() {
			steps = append(steps, nsStep{t.Router, []string{"-6", "addr", "add", netip.PrefixFrom(hostV6(seg.prefix6, routerV6), 64).String(), "dev", dev, "nodad"}})
		}
		for _, st := range steps {
			if err := IP(st.ns, st.args...); err != nil {
				return nil, err
			}
		}
	}
	if o.Underlay.IsValid() {
		if err := sysctl.SetIn("/var/run/netns/"+t.Router, "net/ipv4/ip_forward", "1"); err != nil {
			return nil, err
		}
		if err := IP(t.Underlay, "route", "add", segB.prefix.String(), "via", routerV4(o.Underlay).String()); err != nil {
			return nil, err
		}
	}
	if o.UnderlayV6.IsValid() {
		if err := sysctl.SetIn("/var/run/netns/"+t.Router, "net/ipv6/conf/all/forwarding", "1"); err != nil {
			return nil, err
		}
		if err := IP(t.Underlay, "-6", "route", "add", segB.prefix6.String(), "via", hostV6(o.UnderlayV6, routerV6).String()); err != nil {
			return nil, err
		}
	}
	return segB, nil
}

// nsStep is an `ip` command to run in a namespace.
type nsStep struct {
	ns   string
	args []string
}

// routerV4 is the router's address on an IPv4 segment: .253 of a /24.
func routerV4(seg netip.Prefix) netip.Addr { return lastUsable(seg).Prev() }

// addNode adds node i on seg: its namespace, eth0 with the segment's next
// address, and the port on the segment's bridge.
func (t *Topology) addNode(o Options, i int, seg *segment) error {
	n := Node{Name: fmt.Sprintf("node%d", i), NS: fmt.Sprintf("%s-n%d", o.Prefix, i)}
	if seg.prefix6.IsValid() {
		n.AddrV6 = netip.PrefixFrom(hostV6(seg.prefix6, byte(i)), 64)
		n.Addr = n.AddrV6
	}
	if seg.prefix.IsValid() {
		seg.next = seg.next.Next()
		n.Addr = netip.PrefixFrom(seg.next, seg.prefix.Bits())
	}
	if err := t.addNS(n.NS); err != nil {
		return err
	}
	port := fmt.Sprintf("n%d", i)
	steps := [][]string{{"link", "add", "eth0", "type", "veth", "peer", "name", port, "netns", seg.ns}}
	if seg.prefix.IsValid() {
		steps = append(steps, []string{"addr", "add", n.Addr.String(), "dev", "eth0"})
	}
	if n.AddrV6.IsValid() {
		steps = append(steps, []string{"-6", "addr", "add", n.AddrV6.String(), "dev", "eth0", "nodad"})
	}
	steps = append(steps, []string{"link", "set", "eth0", "up"})
	uSteps := [][]string{{"link", "set", port, "master", "br0"}, {"link", "set", port, "up"}}
	if o.MTU != 0 {
		steps = append(steps, []string{"link", "set", "eth0", "mtu", fmt.Sprint(o.MTU)})
		uSteps = append(uSteps, []string{"link", "set", port, "mtu", fmt.Sprint(o.MTU)})
	}
	switch {
	case o.Routed:
		if seg.prefix.IsValid() {
			steps = append(steps, []string{"route", "add", "default", "via", routerV4(seg.prefix).String()})
		}
		if seg.prefix6.IsValid() {
			steps = append(steps, []string{"-6", "route", "add", "default", "via", hostV6(seg.prefix6, routerV6).String()})
		}
	case o.DefaultRoute:
		if seg.prefix.IsValid() {
			steps = append(steps, []string{"route", "add", "default", "via", lastUsable(o.Underlay).String()})
		}
		if seg.prefix6.IsValid() {
			steps = append(steps, []string{"-6", "route", "add", "default", "via", hostV6(seg.prefix6, bridgeV6).String()})
		}
	}
	for _, s := range steps {
		if err := IP(n.NS, s...); err != nil {
			return err
		}
	}
	for _, s := range uSteps {
		if err := IP(seg.ns, s...); err != nil {
			return err
		}
	}
	t.Nodes = append(t.Nodes, n)
	return nil
}

func lastUsable(p netip.Prefix) netip.Addr {
	a := p.Masked().Addr().As4()
	host := uint32(1)<<(32-p.Bits()) - 2
	v := uint32(a[0])<<24 | uint32(a[1])<<16 | uint32(a[2])<<8 | uint32(a[3])
	v += host
	return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
}

func (t *Topology) addNS(name string) error {
	if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
		return fmt.Errorf("ip netns add %s: %w: %s", name, err, strings.TrimSpace(string(out)))
	}
	t.mu.Lock()
	t.created = append(t.created, name)
	t.mu.Unlock()
	return IP(name, "link", "set", "lo", "up")
}

// Destroy deletes every namespace the topology created, newest first.
// Missing namespaces are fine, so it can run twice.
func (t *Topology) Destroy() error {
	t.mu.Lock()
	names := t.created
	t.created = nil
	t.mu.Unlock()
	var errs []error
	for i := len(names) - 1; i >= 0; i-- {
		out, err := exec.Command("ip", "netns", "del", names[i]).CombinedOutput()
		if err != nil && !strings.Contains(string(out), "No such file") {
			errs = append(errs, fmt.Errorf("ip netns del %s: %w: %s", names[i], err, out))
		}
	}
	return errors.Join(errs...)
}

func linkMAC(ns, dev string) (string, error) {
	out, err := exec.Command("ip", "-n", ns, "-o", "link", "show", "dev", dev).CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("ip -n %s link show %s: %w: %s", ns, dev, err, out)
	}
	f := strings.Fields(string(out))
	for i, w := range f {
		if w == "link/ether" && i+1 < len(f) {
			return f[i+1], nil
		}
	}
	return "", fmt.Errorf("no MAC address for %s in %s", dev, ns)
}
