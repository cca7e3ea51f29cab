// Package sim is a simulated cloud for the eni backend: a stateful provider
// ("sim") shared by every node of a test or lab cluster, and the model of
// its VPC. The VPC is a "fabric" network namespace with one port per NIC;
// it answers ARP for everything (proxy ARP, as a VPC router does), routes
// each address or prefix assigned to an ENI to that ENI's port, and drops
// packets whose source is not routed to the port they came in on (strict
// rp_filter), which is the cloud's source/destination check.
//
// The state lives in one JSON file (ProviderConfig.StateFile) guarded by a
// lock file, so the twilld of every node sees and changes the same cloud.
// Importing the package registers the provider.
package sim

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/twill-net/twill/backend"
	"github.com/twill-net/twill/backend/eni"
	"github.com/twill-net/twill/internal/atomicfile"
	"github.com/twill-net/twill/nl"
)

func init() { eni.RegisterProvider("sim", New) }

// RouteProtocol marks the fabric's routes (the "cloud's").
const RouteProtocol = 180

// State is the simulated cloud.
type State struct {
	// Fabric is the VPC router's network namespace.
	Fabric string
	// VPC is the address space prefixes may be delegated from.
	VPC netip.Prefix
	// Subnet and Gateway: the ENIs' subnet and its router.
	Subnet  netip.Prefix
	Gateway netip.Addr
	// MaxIPsPerENI limits secondary IPs per ENI.
	MaxIPsPerENI int
	ENIs         []ENI
}

// ENI is one simulated ENI, attached to a node.
type ENI struct {
	ID           string
	MAC          string
	PrimaryIP    netip.Prefix
	Port         string // its port in the fabric namespace
	SecondaryIPs []netip.Addr
	Prefixes     []netip.Prefix
}

// Config is the sim provider's ProviderConfig.
type Config struct {
	StateFile string
}

// Create writes a new cloud's state file.
func Create(path string, st State) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	return save(path, &st)
}

// Load reads the state (for tests and twillctl).
func Load(path string) (State, error) {
	var st State
	err := withLock(path, func() error {
		var err error
		st, err = load(path)
		return err
	})
	return st, err
}

// Provider is the sim provider.
type Provider struct {
	path string
	// open gives the fabric namespace's kernel (nl.Open; a model in
	// tests) and a function that releases it.
	open func(ns string) (Fabric, func(), error)
}

// Fabric is what the simulated cloud programs in its router namespace.
type Fabric interface {
	LinkByName(name string) (nl.Link, error)
	RouteReplace(r nl.Route) error
	RouteDel(r nl.Route) error
}

func openFabric(ns string) (Fabric, func(), error) {
	h, err := nl.Open(ns)
	if err != nil {
		return nil, nil, err
	}
	return h, h.Close, nil
}

// New is the sim ProviderFactory.
func New(raw json.RawMessage) (eni.Provider, error) {
	var c Config
	if err := backend.DecodeConfig(raw, &c); err != nil {
		return nil, err
	}
	if c.StateFile == "" {
		return nil, errors.New(`StateFile "": name the simulated cloud's state file`)
	}
	if _, err := os.Stat(c.StateFile); err != nil {
		return nil, fmt.Errorf("StateFile %q: %w", c.StateFile, err)
	}
	return &Provider{path: c.StateFile, open: openFabric}, nil
}

func load(path string) (State, error) {
	var st State
	err := atomicfile.ReadJSON(path, &st)
	return st, err
}

func save(path string, st *State) error {
	return atomicfile.WriteJSON(path, st, 0o644)
}

// withLock runs fn holding the state's lock file (bounded wait).
func withLock(path string, fn func() error) error {
	f, err := os.OpenFile(path+".lock", os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return err
	}
	defer f.Close()
	deadline := time.Now().Add(10 * time.Second)
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("sim: state %s locked for 10s: %w", path, eni.ErrThrottled)
		}
		time.Sleep(5 * time.Millisecond)
	}
	defer syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
	return fn()
}

// change loads the state, lets fn change it and ENI id and program the
// fabric, and saves it if fn succeeded.
func (p *Provider) change(ctx context.Context, id string, fn func(st *State, e *ENI, fabric Fabric) error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	return withLock(p.path, func() error {
		st, err := load(p.path)
		if err != nil {
			return err
		}
		h, closeFabric, err := p.open(st.Fabric)
		if err != nil {
			return fmt.Errorf("sim: fabric: %w", err)
		}
		defer closeFabric()
		e, err := st.find(id)
		if err != nil {
			return err
		}
		if err := fn(&st, e, h); err != nil {
			return err
		}
		return save(p.path, &st)
	})
}

func (st *State) find(id string) (*ENI, error) {
	for i := range st.ENIs {
		if st.ENIs[i].ID == id {
			return &st.ENIs[i], nil
		}
	}
	return nil, fmt.Errorf("sim: no ENI %q", id)
}

func (st *State) toENI(e ENI) eni.ENI {
	return eni.ENI{ID: e.ID, MAC: e.MAC, PrimaryIP: e.PrimaryIP, Gateway: st.Gateway,
		SecondaryIPs: slices.Clone(e.SecondaryIPs), Prefixes: slices.Clone(e.Prefixes), MaxIPs: st.MaxIPsPerENI}
}

// route is the fabric's route to something assigned to e.
func route(h Fabric, e *ENI, dst netip.Prefix) (nl.Route, error) {
	l, err := h.LinkByName(e.Port)
	if err != nil {
		return nl.Route{}, fmt.Errorf("sim: ENI %s port: %w", e.ID, err)
	}
	return nl.Route{Dst: dst, Gw: e.PrimaryIP.Addr(), LinkIndex: l.Index, Protocol: RouteProtocol}, nil
}

// DescribeENI finds the ENI by MAC.
func (p *Provider) DescribeENI(_ context.Context, mac string) (eni.ENI, error) {
	st, err := Load(p.path)
	if err != nil {
		return eni.ENI{}, err
	}
	for _, e := range st.ENIs {
		if strings.EqualFold(e.MAC, mac) {
			return st.toENI(e), nil
		}
	}
	return eni.ENI{}, fmt.Errorf("sim: no ENI with MAC %s", mac)
}

// AssignIPs assigns up to n free addresses of the subnet, within the ENI's
// limit.
func (p *Provider) AssignIPs(ctx context.Context, id string, n int) (eni.ENI, error) {
	var out eni.ENI
	err := p.change(ctx, id, func(st *State, e *ENI, h Fabric) error {
		room := st.MaxIPsPerENI - len(e.SecondaryIPs)
		if st.MaxIPsPerENI > 0 && room <= 0 {
			out = st.toENI(*e)
			return fmt.Errorf("sim: ENI %s holds %d secondary IPs, the most its type allows: %w", id, st.MaxIPsPerENI, eni.ErrLimitExceeded)
		}
		if st.MaxIPsPerENI > 0 {
			n = min(n, room)
		}
		taken := map[netip.Addr]bool{st.Gateway: true}
		for _, o := range st.ENIs {
			taken[o.PrimaryIP.Addr()] = true
			for _, ip := range o.SecondaryIPs {
				taken[ip] = true
			}
		}
		added := 0
		for ip := st.Subnet.Addr().Next(); st.Subnet.Contains(ip) && added < n; ip = ip.Next() {
			if taken[ip] || !st.Subnet.Contains(ip.Next()) { // skip the broadcast address
				continue
			}
			r, err := route(h, e, netip.PrefixFrom(ip, 32))
			if err != nil {
				return err
			}
			if err := h.RouteReplace(r); err != nil {
				return fmt.Errorf("sim: %w", err)
			}
			e.SecondaryIPs = append(e.SecondaryIPs, ip)
			added++
		}
		out = st.toENI(*e)
		if added == 0 {
			return fmt.Errorf("sim: subnet %s has no free address: %w", st.Subnet, eni.ErrSubnetFull)
		}
		return nil
	})
	return out, err
}

// UnassignIPs releases addresses of the ENI.
func (p *Provider) UnassignIPs(ctx context.Context, id string, ips []netip.Addr) error {
	return p.change(ctx, id, func(st *State, e *ENI, h Fabric) error {
		e.SecondaryIPs = slices.DeleteFunc(e.SecondaryIPs, func(ip netip.Addr) bool {
			if !slices.Contains(ips, ip) {
				return false
			}
			if r, err := route(h, e, netip.PrefixFrom(ip, 32)); err == nil {
				_ = h.RouteDel(r)
			}
			return true
		})
		return nil
	})
}

// AssignPrefix delegates p to the ENI if it is in the VPC and nobody else's.
func (p *Provider) AssignPrefix(ctx context.Context, id string, pfx netip.Prefix) error {
	return p.change(ctx, id, func(st *State, e *ENI, h Fabric) error {
		if !st.VPC.Contains(pfx.Addr()) || pfx.Bits() < st.VPC.Bits() || pfx.Overlaps(st.Subnet) {
			return fmt.Errorf("sim: prefix %s is not free address space of VPC %s (ENI subnet %s)", pfx, st.VPC, st.Subnet)
		}
		for _, o := range st.ENIs {
			for _, q := range o.Prefixes {
				if q.Overlaps(pfx) && (o.ID != id || q != pfx) {
					return fmt.Errorf("sim: prefix %s overlaps %s, delegated to ENI %s", pfx, q, o.ID)
				}
			}
		}
		r, err := route(h, e, pfx)
		if err != nil {
			return err
		}
		if err := h.RouteReplace(r); err != nil {
			return fmt.Errorf("sim: %w", err)
		}
		if !slices.Contains(e.Prefixes, pfx) {
			e.Prefixes = append(e.Prefixes, pfx)
		}
		return nil
	})
}

// UnassignPrefix takes a prefix back from the ENI.
func (p *Provider) UnassignPrefix(ctx context.Context, id string, pfx netip.Prefix) error {
	return p.change(ctx, id, func(st *State, e *ENI, h Fabric) error {
		if r, err := route(h, e, pfx); err == nil {
			_ = h.RouteDel(r)
		}
		e.Prefixes = slices.DeleteFunc(e.Prefixes, func(q netip.Prefix) bool { return q == pfx })
		return nil
	})
}
