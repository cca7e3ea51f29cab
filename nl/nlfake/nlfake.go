// Package nlfake models the kernel state twill programs (links and
// their addresses, routes, neighbour and FDB entries, policy rules) as
// maps, behind the same methods as *nl.Handle, with the kernel's answers
// (EEXIST, ESRCH, ENOENT, ENODEV, ENETDOWN). Tests hand it to the sync
// engines and backends instead of a netlink handle and assert on the state
// it holds afterwards, without root. It models state, not calls: a test
// never checks which methods were called, only what the kernel holds.
package nlfake

import (
	"fmt"
	"net/netip"
	"slices"
	"sort"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/twill-net/twill/nl"
)

// Kernel implements the kernel seam's contract.
var _ nl.Kernel = (*Kernel)(nil)

// Kernel is one network namespace's state. The zero value is empty and
// ready; it is safe for concurrent use.
type Kernel struct {
	mu        sync.Mutex
	nextIndex int                             // guarded by mu
	links     map[int]*link                   // guarded by mu
	routes    map[nl.Key]nl.Route             // guarded by mu
	neighs    map[int]map[netip.Addr]nl.Neigh // guarded by mu; by link, IP
	fdb       map[int]map[[6]byte]nl.Neigh    // guarded by mu; by link, MAC
	rules     []nl.Rule                       // guarded by mu
	watchers  map[*watcher]struct{}           // guarded by mu; watch.go
	// NoWireGuard makes it a kernel without the wireguard module.
	NoWireGuard bool
	// Fail, when set, is consulted before every change: a non-nil error is
	// returned instead of making it (a kernel that refuses).
	Fail func(what string) error
}

type link struct {
	l     nl.Link
	vxlan *nl.VXLAN
	addrs []netip.Prefix
	// noTXChecksum: nl.FeatureTXChecksum turned off (a new device has it on).
	noTXChecksum bool
}

func (k *Kernel) initLocked() {
	if k.links == nil {
		k.links, k.routes = map[int]*link{}, map[nl.Key]nl.Route{}
		k.neighs, k.fdb = map[int]map[netip.Addr]nl.Neigh{}, map[int]map[[6]byte]nl.Neigh{}
		k.nextIndex = 1
	}
}

func (k *Kernel) fail(what string) error {
	if k.Fail != nil {
		return k.Fail(what)
	}
	return nil
}

// AddLink adds a link (an external interface, say) and returns it.
func (k *Kernel) AddLink(name string, mtu int, up bool, addrs ...netip.Prefix) nl.Link {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.initLocked()
	l := nl.Link{Index: k.nextIndex, Name: name, MTU: mtu, Up: up, Type: "veth", HardwareAddr: []byte{0x52, 0x54, 0, 0, 0, byte(k.nextIndex)}}
	k.nextIndex++
	k.links[l.Index] = &link{l: l, addrs: slices.Clone(addrs)}
	k.emitLinkLocked(nl.LinkEvent{Link: l})
	return l
}

// AddTUN adds a TUN device, down (a userspace WireGuard device's, say).
func (k *Kernel) AddTUN(name string, mtu int) nl.Link {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.initLocked()
	l := nl.Link{Index: k.nextIndex, Name: name, MTU: mtu, Type: "tuntap"}
	k.nextIndex++
	k.links[l.Index] = &link{l: l}
	return l
}

// AddBridge adds a bridge, up, with addrs.
func (k *Kernel) AddBridge(name string, addrs ...netip.Prefix) nl.Link {
	l := k.AddLink(name, 1500, true, addrs...)
	k.mu.Lock()
	defer k.mu.Unlock()
	k.links[l.Index].l.Type = "bridge"
	return k.links[l.Index].l
}

// SetMaster makes link index a port of master (0: of none).
func (k *Kernel) SetMaster(index, master int) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if l, ok := k.links[index]; ok {
		l.l.MasterIndex = master
	}
}

// SetUp sets a link's state; taking it down flushes the routes through it,
// as the kernel does for IPv4, without a word.
func (k *Kernel) SetUp(index int, up bool) {
	k.behind(index, func(l *nl.Link) {
		l.Up = up
		if up {
			return
		}
		for key, r := range k.routes {
			if r.LinkIndex == index {
				delete(k.routes, key)
			}
		}
	})
}

// behind changes link index, if there is one, behind twill's back (no
// failure to inject), and announces it as the kernel would.
func (k *Kernel) behind(index int, change func(*nl.Link)) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.initLocked()
	if l, ok := k.links[index]; ok {
		change(&l.l)
		k.emitLinkLocked(nl.LinkEvent{Link: l.l})
	}
}

func (k *Kernel) linkLocked(index int) (*link, error) {
	l, ok := k.links[index]
	if !ok {
		return nil, fmt.Errorf("link #%d: %w", index, unix.ENODEV)
	}
	return l, nil
}

// Links lists every link.
func (k *Kernel) Links() ([]nl.Link, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.initLocked()
	out := make([]nl.Link, 0, len(k.links))
	for _, l := range k.links {
		out = append(out, l.l)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Index < out[j].Index })
	return out, nil
}

// LinkByName returns the link called name.
func (k *Kernel) LinkByName(name string) (nl.Link, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	l, err := k.linkByNameLocked(name)
	if err != nil {
		return nl.Link{}, err
	}
	return l.l, nil
}

// TXChecksum reports whether the named link has nl.FeatureTXChecksum on.
func (k *Kernel) TXChecksum(name string) (bool, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	l, err := k.linkByNameLocked(name)
	if err != nil {
		return false, err
	}
	return !l.noTXChecksum, nil
}

// SetTXChecksum turns nl.FeatureTXChecksum on or off on the named link.
func (k *Kernel) SetTXChecksum(name string, on bool) error {
	if err := k.fail("tx checksum"); err != nil {
		return err
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	l, err := k.linkByNameLocked(name)
	if err != nil {
		return err
	}
	l.noTXChecksum = !on
	return nil
}

func (k *Kernel) linkByNameLocked(name string) (*link, error) {
	k.initLocked()
	for _, l := range k.links {
		if l.l.Name == name {
			return l, nil
		}
	}
	return nil, fmt.Errorf("finding link %q: %w", name, nl.ErrLinkNotFound)
}

// LinkByIndex returns the link with the given index.
func (k *Kernel) LinkByIndex(index int) (nl.Link, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.initLocked()
	if l, ok := k.links[index]; ok {
		return l.l, nil
	}
	return nl.Link{}, fmt.Errorf("finding link #%d: %w", index, nl.ErrLinkNotFound)
}

// LinkExists reports whether a link called name exists.
func (k *Kernel) LinkExists(name string) (bool, error) {
	_, err := k.LinkByName(name)
	return err == nil, nil
}

// LinkDel deletes a link, with everything on it; a missing link is fine.
func (k *Kernel) LinkDel(index int) error {
	if err := k.fail("link del"); err != nil {
		return err
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	k.initLocked()
	if l, ok := k.links[index]; ok {
		k.emitLinkLocked(nl.LinkEvent{Deleted: true, Link: l.l})
	}
	delete(k.links, index)
	for _, l := range k.links {
		if l.l.MasterIndex == index { // a bridge's ports stay, detached
			l.l.MasterIndex = 0
		}
	}
	delete(k.neighs, index)
	delete(k.fdb, index)
	for key, r := range k.routes {
		if r.LinkIndex == index {
			delete(k.routes, key)
		}
	}
	return nil
}

// LinkSetUp brings a link up.
func (k *Kernel) LinkSetUp(index int) error {
	return k.setLink("link up", index, func(l *nl.Link) { l.Up = true })
}

// setLink changes link index as op (the name Fail matches) does, and
// announces the change as the kernel would.
func (k *Kernel) setLink(op string, index int, change func(*nl.Link)) error {
	return k.withLink(op, index, func(l *link) error {
		change(&l.l)
		k.emitLinkLocked(nl.LinkEvent{Link: l.l})
		return nil
	})
}

// withLink runs do, holding the kernel's lock, on link index, unless op
// (the name Fail matches) fails or there is no such link.
func (k *Kernel) withLink(op string, index int, do func(*link) error) error {
	if err := k.fail(op); err != nil {
		return err
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	k.initLocked()
	l, err := k.linkLocked(index)
	if err != nil {
		return err
	}
	return do(l)
}

// VXLANAdd creates a VXLAN device.
func (k *Kernel) VXLANAdd(v nl.VXLAN) (nl.Link, error) {
	if err := k.fail("vxlan add"); err != nil {
		return nl.Link{}, err
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	k.initLocked()
	for _, l := range k.links {
		if l.l.Name == v.Name {
			return nl.Link{}, fmt.Errorf("creating vxlan device %s: %w", v.Name, unix.EEXIST)
		}
		// The kernel keeps one device per VNI and UDP port (for one
		// underlay family): another name does not help.
		if o := l.vxlan; o != nil && o.VNI == v.VNI && o.Port == v.Port && o.SrcAddr.Is4() == v.SrcAddr.Is4() {
			return nl.Link{}, fmt.Errorf("creating vxlan device %s (VNI %d, port %d): %w", v.Name, v.VNI, v.Port, unix.EEXIST)
		}
	}
	if _, ok := k.links[v.VtepDevIndex]; v.VtepDevIndex != 0 && !ok {
		return nl.Link{}, fmt.Errorf("creating vxlan device %s on #%d: %w", v.Name, v.VtepDevIndex, unix.ENODEV)
	}
	mac := slices.Clone(v.HardwareAddr)
	if len(mac) == 0 {
		mac = []byte{0x0a, 0xff, 0, 0, 0, byte(k.nextIndex)}
	}
	vc := v
	vc.HardwareAddr = mac
	l := nl.Link{Index: k.nextIndex, Name: v.Name, MTU: v.MTU, Type: "vxlan", HardwareAddr: mac}
	k.nextIndex++
	k.links[l.Index] = &link{l: l, vxlan: &vc}
	return l, nil
}

// VXLANByName reads a VXLAN device's configuration.
func (k *Kernel) VXLANByName(name string) (nl.Link, nl.VXLAN, bool, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.initLocked()
	for _, l := range k.links {
		if l.l.Name != name {
			continue
		}
		if l.vxlan == nil {
			return l.l, nl.VXLAN{}, false, nil
		}
		v := *l.vxlan
		v.MTU, v.HardwareAddr = l.l.MTU, slices.Clone(l.l.HardwareAddr)
		return l.l, v, true, nil
	}
	return nl.Link{}, nl.VXLAN{}, false, fmt.Errorf("finding link %q: %w", name, nl.ErrLinkNotFound)
}

// WireGuardAdd creates a WireGuard device, as a kernel with the module
// does; with NoWireGuard set it answers as one without.
func (k *Kernel) WireGuardAdd(name string, mtu int) (nl.Link, error) {
	if err := k.fail("wireguard add"); err != nil {
		return nl.Link{}, err
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	k.initLocked()
	if k.NoWireGuard {
		return nl.Link{}, fmt.Errorf("creating wireguard device %s: %w: %w", name, nl.ErrNotSupported, unix.EOPNOTSUPP)
	}
	for _, l := range k.links {
		if l.l.Name == name {
			return nl.Link{}, fmt.Errorf("creating wireguard device %s: %w", name, unix.EEXIST)
		}
	}
	l := nl.Link{Index: k.nextIndex, Name: name, MTU: mtu, Type: "wireguard"}
	k.nextIndex++
	k.links[l.Index] = &link{l: l}
	return l, nil
}

// LinkSetMTU sets a link's MTU.
func (k *Kernel) LinkSetMTU(index, mtu int) error {
	return k.setLink("link set mtu", index, func(l *nl.Link) { l.MTU = mtu })
}

// SetMTU changes a link's MTU (a change behind twill's back).
func (k *Kernel) SetMTU(index, mtu int) {
	k.behind(index, func(l *nl.Link) { l.MTU = mtu })
}

// Addrs lists the addresses of a link (all links when 0).
func (k *Kernel) Addrs(index int, family nl.Family) ([]nl.Addr, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.initLocked()
	var out []nl.Addr
	for i, l := range k.links {
		if index != 0 && i != index {
			continue
		}
		for _, p := range l.addrs {
			if family == nl.FamilyAll || (family == nl.FamilyV4) == p.Addr().Is4() {
				out = append(out, nl.Addr{Prefix: p, LinkIndex: i})
			}
		}
	}
	return out, nil
}

// AddrAdd assigns an address to a link.
func (k *Kernel) AddrAdd(index int, p netip.Prefix) error {
	return k.withLink("addr add", index, func(l *link) error {
		if slices.Contains(l.addrs, p) {
			return fmt.Errorf("adding address %s: %w", p, unix.EEXIST)
		}
		l.addrs = append(l.addrs, p)
		k.emitAddrLocked(nl.AddrEvent{LinkIndex: index, Prefix: p})
		return nil
	})
}

// AddrDel removes an address from a link; a missing one is fine, as the
// kernel's handle reports it.
func (k *Kernel) AddrDel(index int, p netip.Prefix) error {
	return k.withLink("addr del", index, func(l *link) error {
		i := slices.Index(l.addrs, p)
		if i < 0 {
			return nil
		}
		l.addrs = slices.Delete(l.addrs, i, i+1)
		k.emitAddrLocked(nl.AddrEvent{Deleted: true, LinkIndex: index, Prefix: p})
		return nil
	})
}

// Routes lists the unicast routes matching f.
func (k *Kernel) Routes(family nl.Family, f nl.RouteFilter) ([]nl.Route, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.initLocked()
	table := f.Table
	if table == 0 {
		table = 254
	}
	var out []nl.Route
	for key, r := range k.routes {
		switch {
		case !f.AllTables && int(key.Table) != table,
			f.Protocol != 0 && r.Protocol != f.Protocol,
			f.LinkIndex != 0 && r.LinkIndex != f.LinkIndex,
			family == nl.FamilyV4 && !key.V4, family == nl.FamilyV6 && key.V4:
			continue
		}
		out = append(out, r)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Dst.String() < out[j].Dst.String() })
	return out, nil
}

// RouteBatch applies route changes as the kernel would, one error each.
func (k *Kernel) RouteBatch(ops []nl.RouteOp) []error {
	errs := make([]error, len(ops))
	for i, op := range ops {
		errs[i] = k.route(op.Op, op.Route)
	}
	return errs
}

// RouteReplace adds or replaces a route.
func (k *Kernel) RouteReplace(r nl.Route) error { return k.route(nl.OpReplace, r) }

// RouteDel deletes a route (a change behind twill's back, in tests); a
// missing one is fine.
func (k *Kernel) RouteDel(r nl.Route) error { return k.route(nl.OpDel, r) }

func (k *Kernel) route(op nl.Op, r nl.Route) error {
	if err := k.fail("route"); err != nil {
		return err
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	k.initLocked()
	key := r.Key()
	if op == nl.OpDel {
		old, ok := k.routes[key]
		if !ok {
			return nil // ESRCH, which twill's batches treat as done
		}
		delete(k.routes, key)
		k.emitRouteLocked(nl.RouteEvent{Deleted: true, Route: old})
		return nil
	}
	if r.Type == nl.RouteBlackhole {
		// A blackhole has no link and no gateway.
		if r.LinkIndex != 0 || r.Gw.IsValid() {
			return fmt.Errorf("route %s: %w", r, unix.EINVAL)
		}
	} else {
		l, err := k.linkLocked(r.LinkIndex)
		if err != nil {
			return fmt.Errorf("route %s: %w", r, err)
		}
		if !l.l.Up {
			return fmt.Errorf("route %s: %w", r, unix.ENETDOWN)
		}
	}
	if _, ok := k.routes[key]; ok && op == nl.OpAdd {
		return fmt.Errorf("adding route %s: %w", r, unix.EEXIST)
	}
	if r.Table == 0 {
		r.Table = 254
	}
	if r.Dst.Addr().Is6() {
		// IPv6 has no route scopes: the kernel takes any and reports
		// RT_SCOPE_UNIVERSE.
		r.Scope = nl.ScopeUniverse
	}
	k.routes[key] = r
	k.emitRouteLocked(nl.RouteEvent{Route: r})
	return nil
}
