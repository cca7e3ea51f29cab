package wireguard

import (
	"bytes"
	"context"
	"maps"
	"net/netip"
	"slices"
	"time"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"

	"github.com/twill-net/twill/internal/tick"
)

// First handshakes. WireGuard drops a handshake from a key it does not
// know, and the sender waits 5s before it tries again. Two nodes rarely
// learn of each other at the same moment, so the first to send may be
// dropped. And when both send at once, each answers the other's and
// drops the answer to its own: both then wait for data that never comes,
// for 5s. A peer just added is therefore sent one datagram through the
// tunnel by one side only, the one whose public key is the lower (the
// lead); the other side sends it only when, yieldFor later, nothing has
// come from the peer (the lead's handshake was dropped: it did not know
// this node yet). Then both follow the peer: while it has no handshake,
// the lead takes it out of the device and puts it back every
// retryGreeting (a peer put back has forgotten the handshake that went
// wrong, so the next datagram starts a new one at once), and so does the
// other side while nothing at all has come from it; for at most
// greetFor, after which WireGuard's own retries carry on.
//
// A node that rotates its key follows every peer the same way: WireGuard
// ends every session when the key changes, and the node's traffic starts
// handshakes its peers drop until they learn the new key, or that cross
// theirs once they have. It sends no datagram at first (its peers do not
// know the key yet). Whichever side leads (the rotating node, or a peer
// that took the new key in place of the old) puts the peer back after
// rekeyRetry already: a crossing is the likely failure there, as both
// sides have traffic waiting, and peers learn of a key within
// milliseconds.
const (
	greetEvery    = 100 * time.Millisecond
	yieldFor      = 200 * time.Millisecond
	retryGreeting = time.Second
	rekeyRetry    = 300 * time.Millisecond
	greetFor      = 6 * time.Second
)

// fresh is a peer just added to a device (rotated: in place of another
// key of its lease), or one whose session ended because the device took a
// new key (rekey).
type fresh struct {
	dev            string
	key            wgtypes.Key
	addr           netip.Addr // its device address, where the datagram goes
	rekey, rotated bool
}

// greeting is a fresh peer being followed.
type greeting struct {
	// since: before the change that made the peer fresh; a handshake
	// after it is the one followed.
	since, last time.Time
	addr        netip.Addr
	lead        bool // this side's key is the lower: it greets first
	nudged      bool // a datagram went to it
	// retry is how long the lead waits from last before it puts the
	// peer back (0: retryGreeting).
	retry time.Duration
}

// leads reports whether a node with key self greets a peer with key
// other first: both sides agree on it.
func leads(self, other wgtypes.Key) bool { return bytes.Compare(self[:], other[:]) < 0 }

// greet nudges the fresh peers this side leads (but rekeyed ones), and
// follows them all from since; none when there are over maxNudges (a
// node's start in a large cluster: traffic starts those).
func (n *Network) greet(fs []fresh, since time.Time) {
	if len(fs) == 0 || len(fs) > maxNudges {
		return
	}
	now := time.Now()
	var lead []netip.Addr
	n.mu.Lock()
	self := n.key.PublicKey()
	for _, f := range fs {
		if n.greeting[f.dev] == nil {
			n.greeting[f.dev] = map[wgtypes.Key]greeting{}
		}
		g := greeting{since: since, last: now, addr: f.addr, lead: leads(self, f.key)}
		if f.rekey || f.rotated {
			g.retry = rekeyRetry
		}
		switch {
		case f.rekey:
			g.nudged = true
		case g.lead:
			g.nudged = true
			lead = append(lead, f.addr)
		}
		n.greeting[f.dev][f.key] = g
	}
	n.mu.Unlock()
	for _, a := range lead {
		n.nudge(a)
	}
}

// followHandshakes follows the fresh peers' first handshakes until ctx is
// done.
func (n *Network) followHandshakes(ctx context.Context) error {
	return tick.Every(ctx, greetEvery, func() {
		for _, t := range n.b.tunnels {
			n.followOnce(ctx, t, time.Now())
		}
	})
}

// followOnce checks one device's fresh peers when one is due (see
// greetingDue): those with a handshake, or followed for greetFor, are
// done; the others are nudged, or put back and nudged, as greetNext says.
func (n *Network) followOnce(ctx context.Context, t tunnel, now time.Time) {
	if !n.greetingDue(t.name, now) {
		return
	}
	n.opMu.Lock()
	defer n.opMu.Unlock()
	dev, err := n.b.devices.open(t.name, n.b.devices.Impl(t.name))
	if err != nil {
		return
	}
	n.mu.Lock()
	keys := slices.Collect(maps.Keys(n.greeting[t.name]))
	n.mu.Unlock()
	have, err := n.followedPeers(ctx, t.name, dev, keys)
	if err != nil {
		return
	}
	// heard: the peer sent anything authenticated (a handshake
	// initiation counts): this side has answered it, and waits for its
	// data.
	shook := make(map[wgtypes.Key]time.Time, len(have))
	heard := make(map[wgtypes.Key]bool, len(have))
	for _, p := range have {
		shook[p.PublicKey] = p.LastHandshakeTime
		heard[p.PublicKey] = p.ReceiveBytes > 0
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
		if shook[k].After(g.since) || !wanted || now.Sub(g.since) > greetFor {
			delete(n.greeting[t.name], k)
			continue
		}
		switch greetNext(g, heard[k], now) {
		case greetWait:
			continue
		case greetPutBack:
			cfg.Peers = append(cfg.Peers, wgtypes.PeerConfig{PublicKey: k, Remove: true}, peerConfig(p, n.sh))
		}
		g.last, g.nudged, g.retry = now, true, 0
		n.greeting[t.name][k] = g
		again = append(again, g.addr)
	}
	n.mu.Unlock()
	if len(again) == 0 {
		return
	}
	if len(cfg.Peers) > 0 {
		n.putBack(ctx, t, dev, cfg, rec)
	}
	for _, a := range again {
		n.nudge(a)
	}
}

// greetingDue reports whether a fresh peer of device dev is due now: to
// be nudged, put back, or given up on, were it still without a
// handshake. Only then does followOnce read the device, which holds back
// lease events while it runs (wireguard-go reads every peer for it): a
// handshake done in between is seen at the next due moment.
func (n *Network) greetingDue(dev string, now time.Time) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, g := range n.greeting[dev] {
		if now.Sub(g.since) > greetFor || greetNext(g, false, now) != greetWait {
			return true
		}
	}
	return false
}

// followedPeers reads the peers with the given keys from device name:
// only those from a device that can (twill-wg, by the version it
// serves), else the whole device. The device is asked at each call, so a
// twill-wg updated under a running twilld is read by key from its next
// call on.
// The caller holds opMu.
func (n *Network) followedPeers(ctx context.Context, name string, dev Device, keys []wgtypes.Key) ([]wgtypes.Peer, error) {
	if peers := dev.Extensions(ctx).Peers; peers != nil {
		if _, was := n.noPeersQuery[name]; was {
			delete(n.noPeersQuery, name)
			n.b.log.Info("the device answers a peers query again (its twill-wg was updated)", "device", name)
		}
		return peers(ctx, keys)
	}
	if _, was := n.noPeersQuery[name]; !was {
		if n.noPeersQuery == nil {
			n.noPeersQuery = map[string]bool{}
		}
		n.noPeersQuery[name] = true
		n.b.log.Info("the device does not answer a peers query (a twill-wg older than this twilld): following first handshakes by reading every peer until it does", "device", name)
	}
	d, err := dev.Get(ctx)
	if err != nil {
		return nil, err
	}
	return d.Peers, nil
}

// What followOnce does next about a peer without a handshake.
const (
	greetWait    = iota // nothing yet
	greetNudge          // send it a datagram
	greetPutBack        // put it back in the device, then send it one
)

// greetNext decides for a fresh peer without a handshake; heard: it has
// sent this side something.
func greetNext(g greeting, heard bool, now time.Time) int {
	switch {
	case g.lead:
		retry := g.retry
		if retry == 0 {
			retry = retryGreeting
		}
		if now.Sub(g.last) >= retry {
			return greetPutBack
		}
	case heard:
		// The lead's handshake got here: it completes it, or puts the
		// peer back itself.
	case !g.nudged:
		if now.Sub(g.since) >= yieldFor {
			return greetNudge
		}
	case now.Sub(g.last) >= retryGreeting:
		return greetPutBack
	}
	return greetWait
}

// putBack applies cfg (peers taken out and put back) to t's device.
func (n *Network) putBack(ctx context.Context, t tunnel, dev Device, cfg wgtypes.Config, rec *record) {
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
	n.b.log.Debug("put back peers without a first handshake", "device", t.name, "count", len(cfg.Peers)/2)
}
