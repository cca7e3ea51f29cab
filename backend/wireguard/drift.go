package wireguard

import (
	"context"
	"fmt"

	"golang.org/x/sync/errgroup"
	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"

	"github.com/twill-net/twill/backend"
	"github.com/twill-net/twill/backend/kernelsync"
	"github.com/twill-net/twill/internal/tick"
	"github.com/twill-net/twill/nl"
	"github.com/twill-net/twill/subnet"
)

// WatchKernel pokes when a device no longer matches what was applied (a
// peer removed or altered by hand, the device gone) or one of the routes
// changed.
func (n *Network) WatchKernel(ctx context.Context, poke, watching func()) error {
	n.mu.Lock()
	n.poke = poke
	n.mu.Unlock()
	g, ctx := errgroup.WithContext(ctx)
	g.Go(func() error { return n.routes.Watch(ctx, n.b.log, poke, watching) })
	g.Go(func() error { return n.pollDevices(ctx, poke) })
	g.Go(func() error { return n.followHandshakes(ctx) })
	return g.Wait()
}

func (n *Network) pollDevices(ctx context.Context, poke func()) error {
	return tick.Every(ctx, n.poll, func() {
		if n.drifted(ctx) {
			poke()
		}
	})
}

// drifted reports whether a device differs from what was last applied: a
// device that tells its generation is read back only when it changed.
func (n *Network) drifted(ctx context.Context) bool {
	for _, t := range n.b.tunnels {
		if n.deviceDrifted(ctx, t) {
			return true
		}
	}
	return false
}

// deviceDrifted is drifted for one device. It holds opMu: the record and
// the device's generation must be read between two changes of twilld's
// own (read beside a lease event, the generation had moved past the
// record's, and the device read back before the event was set against
// the record after it: a drift that was not, and a full reconcile of
// every peer, every poll while events came).
func (n *Network) deviceDrifted(ctx context.Context, t tunnel) bool {
	n.opMu.Lock()
	defer n.opMu.Unlock()
	n.mu.Lock()
	rec, ok := n.last[t.name]
	var gen uint64
	if ok {
		gen = rec.gen
	}
	n.mu.Unlock()
	if !ok {
		return false
	}
	link, err := n.b.devices.k.LinkByName(t.name)
	if err != nil || !link.Up || link.MTU != t.mtu {
		return true
	}
	dev, err := n.b.devices.open(t.name, n.b.devices.Impl(t.name))
	if err != nil {
		return true
	}
	now := generation(ctx, dev)
	if gen != 0 && now == gen {
		return false
	}
	have, err := dev.Get(ctx)
	if err != nil {
		return true
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	_, c := plan(have, n.key, t.port, rec.peers, n.sh)
	if c == 0 && n.last[t.name] == rec {
		rec.gen = now // changed, but to what twilld wants: trust it again
	}
	return c > 0
}

// Drift compares the devices and routes with what peers call for,
// changing nothing.
func (n *Network) Drift(ctx context.Context, peers []subnet.Lease) (backend.Drift, error) {
	key := n.currentKey()
	var (
		d  backend.Drift
		rs = failClosed(n.b.tunnels, n.b.opts.Config, nil)
	)
	for _, t := range n.b.tunnels {
		want, refused, _ := desired(t, key, peers)
		d.Refused = append(d.Refused, refused...)
		d.Objects += len(want)
		link, err := n.b.devices.k.LinkByName(t.name)
		if err != nil {
			d.Missing = append(d.Missing, "wireguard device "+t.name)
			continue
		}
		routes(want, link.Index, func(r nl.Route) { rs = append(rs, r) })
		dev, err := n.b.devices.open(t.name, n.b.devices.Impl(t.name))
		if err != nil {
			return d, err
		}
		have, err := dev.Get(ctx)
		if err != nil {
			return d, err
		}
		peerDrift(&d, t, have, key, want, n.sh)
	}
	rd, err := kernelsync.RouteDrift(n.b.devices.k, 0, rs)
	d.Missing, d.Extra, d.Wrong = append(d.Missing, rd.Missing...), append(d.Extra, rd.Extra...), append(d.Wrong, rd.Wrong...)
	d.Objects += rd.Objects
	d.Shadowed = rd.Shadowed
	return d, err
}

func peerDrift(d *backend.Drift, t tunnel, have *wgtypes.Device, key wgtypes.Key, want map[wgtypes.Key]peer, sh shared) {
	if have.PrivateKey != key {
		d.Wrong = append(d.Wrong, "wireguard device "+t.name+": not this node's private key")
	}
	if have.ListenPort != t.port {
		d.Wrong = append(d.Wrong, fmt.Sprintf("wireguard device %s: listen port %d, not %d", t.name, have.ListenPort, t.port))
	}
	seen := map[wgtypes.Key]bool{}
	for _, hp := range have.Peers {
		seen[hp.PublicKey] = true
		p, ok := want[hp.PublicKey]
		switch {
		case !ok:
			d.Extra = append(d.Extra, "wireguard peer "+hp.PublicKey.String()+" dev "+t.name)
		case !samePeer(hp, p, sh):
			d.Wrong = append(d.Wrong, "wireguard peer "+p.describe()+" dev "+t.name)
		}
	}
	for k, p := range want {
		if !seen[k] {
			d.Missing = append(d.Missing, "wireguard peer "+p.describe()+" dev "+t.name)
		}
	}
}

func (p peer) describe() string {
	return fmt.Sprintf("%s endpoint %s allowed-ips %s (%s)", p.key, p.endpoint, prefixList(p.allowed), p.lease)
}
