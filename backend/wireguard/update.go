package wireguard

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"time"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"

	"github.com/twill-net/twill/backend"
	"github.com/twill-net/twill/nl"
	"github.com/twill-net/twill/subnet"
)

var _ backend.Updater = (*Network)(nil)

func equalPeer(a, b peer) bool {
	return a.key == b.key && a.endpoint == b.endpoint && slices.Equal(a.allowed, b.allowed)
}

// change is what one lease event does to one device.
type change struct {
	t      tunnel
	rec    *record
	cfg    wgtypes.Config
	put    []peer   // peers added or changed
	drop   []string // leases whose peer goes
	fresh  []fresh  // new peers, to greet
	routes []nl.Route
	gone   []netip.Prefix
	gen    uint64 // the device's generation after the change (0: none made)
}

// Update applies a change of the peer set against the record of what was
// last applied, without reading the devices back: the peers of the leases
// upserted and removed, in one set per device, then their routes. What the
// record cannot settle alone (a device never reconciled, a refused lease,
// a key that is this node's or another lease's) asks for a full Reconcile.
func (n *Network) Update(ctx context.Context, upserted, removed []subnet.Lease) error {
	n.opMu.Lock()
	defer n.opMu.Unlock()
	n.mu.Lock()
	key := n.key
	var changes []*change
	for _, t := range n.b.tunnels {
		c, err := n.planUpdateLocked(t, key.PublicKey(), upserted, removed)
		if err != nil {
			n.mu.Unlock()
			return fmt.Errorf("wireguard: %w", err)
		}
		changes = append(changes, c)
	}
	n.mu.Unlock()
	var (
		rs    []nl.Route
		gone  []netip.Prefix
		nudge []fresh
	)
	at := time.Now() // before any change: a handshake after it is one of this change's peers
	for _, c := range changes {
		if len(c.cfg.Peers) > 0 {
			dev, err := n.b.devices.open(c.t.name, n.b.devices.Impl(c.t.name))
			if err == nil {
				err = dev.Set(ctx, c.cfg)
			}
			if err != nil {
				n.forget(c.t) // the device is in doubt: read it back next time
				return fmt.Errorf("wireguard: %w", err)
			}
			c.gen = generation(ctx, dev)
		}
		n.commit(c)
		rs, gone, nudge = append(rs, c.routes...), append(gone, c.gone...), append(nudge, c.fresh...)
	}
	if _, err := n.routes.Update(rs, gone); err != nil {
		return fmt.Errorf("wireguard: %w", err)
	}
	n.greet(nudge, at)
	return nil
}

// planUpdateLocked works out one device's change, changing nothing.
func (n *Network) planUpdateLocked(t tunnel, self wgtypes.Key, upserted, removed []subnet.Lease) (*change, error) {
	rec := n.last[t.name]
	if rec == nil {
		return nil, fmt.Errorf("device %s not reconciled yet: %w", t.name, backend.ErrFullReconcile)
	}
	c := &change{t: t, rec: rec}
	for _, l := range slices.Concat(upserted, removed) {
		if _, ok := rec.conflicted[l.String()]; ok {
			return nil, fmt.Errorf("lease %s shared a key: %w", l, backend.ErrFullReconcile)
		}
	}
	for _, l := range removed {
		name := l.String()
		if k, ok := rec.leases[name]; ok {
			c.cfg.Peers = append(c.cfg.Peers, wgtypes.PeerConfig{PublicKey: k, Remove: true})
			c.drop = append(c.drop, name)
			c.gone = append(c.gone, rec.peers[k].allowed...)
		}
	}
	for _, l := range upserted {
		p, ok, why := wantPeer(t, l)
		name := l.String()
		old, had := rec.leases[name]
		switch {
		case why != "" || (!ok && had):
			return nil, fmt.Errorf("lease %s is refused or leaves %s: %w", name, t.name, backend.ErrFullReconcile)
		case !ok:
			continue
		case p.key == self:
			return nil, fmt.Errorf("lease %s publishes this node's key: %w", name, backend.ErrFullReconcile)
		}
		if rec.shared[p.key] {
			return nil, fmt.Errorf("lease %s publishes a key leases share: %w", name, backend.ErrFullReconcile)
		}
		if other, taken := rec.peers[p.key]; taken && other.lease != name {
			return nil, fmt.Errorf("lease %s publishes %s's key: %w", name, other.lease, backend.ErrFullReconcile)
		}
		if had && old == p.key && equalPeer(rec.peers[old], p) {
			continue
		}
		if had && old != p.key {
			c.cfg.Peers = append(c.cfg.Peers, wgtypes.PeerConfig{PublicKey: old, Remove: true})
		}
		if !had || old != p.key {
			c.fresh = append(c.fresh, fresh{dev: t.name, key: p.key, addr: p.allowed[0].Addr(), rotated: had})
		}
		if had {
			for _, a := range rec.peers[old].allowed {
				if !slices.Contains(p.allowed, a) {
					c.gone = append(c.gone, a)
				}
			}
		}
		c.cfg.Peers = append(c.cfg.Peers, peerConfig(p, n.sh))
		c.put = append(c.put, p)
		for _, a := range p.allowed {
			c.routes = append(c.routes, nl.Route{Dst: a, LinkIndex: rec.link, Scope: nl.ScopeLink})
		}
	}
	removalsLast(c.cfg.Peers)
	return c, nil
}

// commit records an applied change.
func (n *Network) commit(c *change) {
	n.mu.Lock()
	defer n.mu.Unlock()
	rec := n.last[c.t.name]
	if rec != c.rec {
		return // a Reconcile replaced the record meanwhile
	}
	if c.gen != 0 {
		rec.gen = c.gen
	}
	for _, name := range c.drop {
		delete(rec.peers, rec.leases[name])
		delete(rec.leases, name)
	}
	for _, p := range c.put {
		if old, ok := rec.leases[p.lease]; ok {
			delete(rec.peers, old)
		}
		rec.peers[p.key] = p
		rec.leases[p.lease] = p.key
	}
}

// forget drops a device's record: the next change reads it back.
func (n *Network) forget(t tunnel) {
	n.mu.Lock()
	defer n.mu.Unlock()
	delete(n.last, t.name)
}
