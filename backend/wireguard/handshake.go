package wireguard

import (
	"context"
	"net/netip"
	"time"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
)

// First handshakes. WireGuard drops a handshake from a key it does not
// know, and the sender waits 5s before it tries again. Two nodes rarely
// learn of each other at the same moment, so the first to send may be
// dropped; and both may, when each sends before the other has it. A peer
// just added is therefore sent one datagram through the tunnel at once,
// and followed: while it has no handshake, it is taken out of the device
// and put back every retryGreeting (a peer put back has forgotten the
// dropped handshake, so the next datagram starts a new one at once), for
// at most greetFor; then WireGuard's own retries carry on.
const (
	greetEvery    = 250 * time.Millisecond
	retryGreeting = time.Second
	greetFor      = 6 * time.Second
)

// fresh is a peer just added to a device.
type fresh struct {
	dev  string
	key  wgtypes.Key
	addr netip.Addr // its device address, where the datagram goes
}

// greeting is a fresh peer being followed.
type greeting struct {
	since, last time.Time
	addr        netip.Addr
}

// greet nudges fresh peers, and follows them; none when there are over
// maxNudges (a node's start in a large cluster: traffic starts those).
func (n *Network) greet(fs []fresh) {
	if len(fs) == 0 || len(fs) > maxNudges {
		return
	}
	now := time.Now()
	n.mu.Lock()
	for _, f := range fs {
		if n.greeting[f.dev] == nil {
			n.greeting[f.dev] = map[wgtypes.Key]greeting{}
		}
		n.greeting[f.dev][f.key] = greeting{since: now, last: now, addr: f.addr}
	}
	n.mu.Unlock()
	for _, f := range fs {
		n.nudge(f.addr)
	}
}

// followHandshakes follows the fresh peers' first handshakes until ctx is
// done.
func (n *Network) followHandshakes(ctx context.Context) error {
	t := time.NewTicker(greetEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		for _, t := range n.b.tunnels {
			n.followOnce(ctx, t, time.Now())
		}
	}
}

// followOnce checks one device's fresh peers: those with a handshake, or
// followed for greetFor, are done; the others are put back and nudged
// again every retryGreeting.
func (n *Network) followOnce(ctx context.Context, t tunnel, now time.Time) {
	n.mu.Lock()
	pending := len(n.greeting[t.name])
	n.mu.Unlock()
	if pending == 0 {
		return
	}
	n.opMu.Lock()
	defer n.opMu.Unlock()
	dev, err := n.b.devices.open(t.name, n.b.devices.Impl(t.name))
	if err != nil {
		return
	}
	have, err := dev.Get(ctx)
	if err != nil {
		return
	}
	shook := make(map[wgtypes.Key]bool, len(have.Peers))
	for _, p := range have.Peers {
		shook[p.PublicKey] = !p.LastHandshakeTime.IsZero()
	}
	var (
		cfg   wgtypes.Config
		again []netip.Addr
	)
	n.mu.Lock()
	rec := n.last[t.name]
	for k, g := range n.greeting[t.name] {
		p, wanted := peer{}, false
		if rec != nil {
			p, wanted = rec.peers[k]
		}
		if shook[k] || !wanted || now.Sub(g.since) > greetFor {
			delete(n.greeting[t.name], k)
			continue
		}
		if now.Sub(g.last) >= retryGreeting {
			cfg.Peers = append(cfg.Peers, wgtypes.PeerConfig{PublicKey: k, Remove: true}, peerConfig(p, n.sh))
			g.last = now
			n.greeting[t.name][k] = g
			again = append(again, g.addr)
		}
	}
	n.mu.Unlock()
	if len(cfg.Peers) == 0 {
		return
	}
	if err := dev.Set(ctx, cfg); err != nil {
		n.b.log.Debug("putting back peers without a handshake failed", "device", t.name, "err", err)
		return
	}
	gen := generation(ctx, dev)
	n.mu.Lock()
	if n.last[t.name] == rec && rec != nil && gen != 0 {
		rec.gen = gen
	}
	n.mu.Unlock()
	n.b.log.Debug("put back peers without a first handshake", "device", t.name, "count", len(again))
	for _, a := range again {
		n.nudge(a)
	}
}
