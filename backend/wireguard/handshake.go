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
// the lead takes it out of the device and puts it back after
// retryGreeting, then every twice that (a peer put back has forgotten
// the handshake that went wrong, so the next datagram starts a new one at
// once), and so does the other side while nothing at all has come from
// it (or, when something did, three times later: the lead may have given
// up); for at most greetFor, after which WireGuard's own retries carry
// on.
//
// A node that rotates its key follows every peer the same way: WireGuard
// ends every session when the key changes, and the node's traffic starts
// handshakes its peers drop until they learn the new key, or that cross
// theirs once they have. It sends no datagram at first (its peers do not
// know the key yet). Both sides retry sooner there (the lead after
// rekeyRetry, the other side after five times that, should the lead's
// retries not have done it): a crossing is the likely failure, as both
// sides have traffic waiting, and peers learn of a key within
// milliseconds. Bytes received tell the rotating node nothing of the new
// session: its peers go on sending on the old one, which it still
// decrypts, until they learn the key.
//
// A handshake is not yet a session both sides hold. Its initiator counts
// it done as soon as the answer comes, before the responder has seen a
// byte of the session; if the responder then loses it (it answered
// another handshake, or was put back), or never confirms it, the
// initiator sends into nothing, and its peer, which answered last, may
// not start a handshake of its own for 5s; WireGuard's own timer mends it
// 15s after the first unanswered packet. So a fresh peer is followed on
// past its handshake: once seen, it is nudged (its kernel's answer comes
// back through the session), and it is done when anything comes from it
// after that; when nothing did within confirmFor, it is put back, and its
// next handshake is followed the same way.
const (
	greetEvery    = 50 * time.Millisecond
	yieldFor      = 200 * time.Millisecond
	retryGreeting = time.Second
	// rekeyRetry: a put-back also drops the packets the device holds for
	// the peer until a handshake completes (a connection's first SYN, say,
	// whose sender then waits 1s to send it again): after a rotation that
	// lost two handshake messages, the lead's third try (after rekeyRetry,
	// then twice that) must come well within that second. Handshakes that
	// take longer than twice this to answer are put back until the other
	// side's retry (5 rekeyRetry) or WireGuard's own.
	rekeyRetry = 150 * time.Millisecond
	confirmFor = 300 * time.Millisecond
	greetFor   = 6 * time.Second
	// rekeyFor is how long a node that rotated its key follows its peers:
	// one may take up the key seconds late (its twilld, or etcd, slow to
	// tell it), and its first handshake may cross this node's retries.
	rekeyFor = 15 * time.Second
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
	// rotation: a key changed, this node's or the peer's (a pair whose
	// traffic waits: it is read at every greetEvery); rekeyed: this
	// node's own (bytes received from the peer may be the old session's).
	rotation, rekeyed bool
	// retry is how long this side waits from last, without a handshake,
	// before it puts the peer back (0: retryGreeting); it doubles after
	// the first put-back (tries), as does confirmFor (see backoff).
	retry time.Duration
	tries int
	// shook is the handshake seen after since, seenAt when this side
	// first saw it, and rx the bytes received from the peer then (see
	// confirm).
	shook, seenAt time.Time
	rx            int64
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
		g := greeting{since: since, last: now, addr: f.addr, lead: leads(self, f.key), rotation: f.rekey || f.rotated, rekeyed: f.rekey}
		if g.rotation {
			g.retry = rekeyRetry
			if !g.lead {
				g.retry = 5 * rekeyRetry
			}
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
// greetingDue): those whose session is confirmed, or followed for
// greetFor, are done; the others are nudged, or put back and nudged, as
// greetNext (no handshake yet) or confirm (one) says.
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
	seen := make(map[wgtypes.Key]wgtypes.Peer, len(have))
	for _, p := range have {
		seen[p.PublicKey] = p
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
		if !wanted || now.Sub(g.since) > g.followFor() {
			delete(n.greeting[t.name], k)
			continue
		}
		var next int
		if hp := seen[k]; hp.LastHandshakeTime.After(g.since) {
			next = g.confirm(hp.LastHandshakeTime, hp.ReceiveBytes, now)
		} else {
			// heard: the peer sent anything authenticated (a handshake
			// initiation counts): this side has answered it, and waits
			// for its data.
			g.shook = time.Time{}
			next = greetNext(g, !g.rekeyed && hp.ReceiveBytes > 0, now)
		}
		switch next {
		case greetDone:
			delete(n.greeting[t.name], k)
			continue
		case greetWait:
			n.greeting[t.name][k] = g
			continue
		case greetPutBack:
			cfg.Peers = append(cfg.Peers, wgtypes.PeerConfig{PublicKey: k, Remove: true}, peerConfig(p, n.sh))
			g.shook = time.Time{}
			g.last = now
			g.tries++
		case greetNudge:
			if g.shook.IsZero() {
				g.last = now
			}
		}
		g.nudged = true
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
// handshake, or to have its handshake confirmed; after a key change,
// always (its handshake is confirmed as soon as it comes). Only then
// does followOnce read the device, which holds back lease events while
// it runs (wireguard-go reads every peer for it): a handshake done in
// between is seen at the next due moment.
func (n *Network) greetingDue(dev string, now time.Time) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, g := range n.greeting[dev] {
		if g.rotation || !g.shook.IsZero() || now.Sub(g.since) > g.followFor() || greetNext(g, false, now) != greetWait {
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

// What followOnce does next about a fresh peer.
const (
	greetWait    = iota // nothing yet
	greetNudge          // send it a datagram
	greetPutBack        // put it back in the device, then send it one
	greetDone           // its session is confirmed: follow it no more
)

// greetNext decides for a fresh peer without a handshake; heard: it has
// sent this side something.
func greetNext(g greeting, heard bool, now time.Time) int {
	retry := g.retry
	if retry == 0 {
		retry = retryGreeting
	}
	retry = g.backoff(retry)
	switch {
	case g.lead:
		if now.Sub(g.last) >= retry {
			return greetPutBack
		}
	case heard:
		// The lead's handshake got here: it completes it, or puts the
		// peer back itself; unless it no longer follows the peer (it
		// gave up before this side took up its key).
		if now.Sub(g.last) >= 3*retry {
			return greetPutBack
		}
	case !g.nudged:
		if now.Sub(g.since) >= yieldFor {
			return greetNudge
		}
	case now.Sub(g.last) >= retry:
		return greetPutBack
	}
	return greetWait
}

// confirm decides for a fresh peer whose handshake hs came after since,
// rx the bytes received from it now: a handshake first seen (or a newer
// one) is nudged, so that the peer's kernel answers through the session
// when nothing else flows; the peer is done once bytes came after that,
// and put back when none came within confirmFor.
func (g *greeting) confirm(hs time.Time, rx int64, now time.Time) int {
	switch {
	case !g.shook.Equal(hs):
		g.shook, g.seenAt, g.rx = hs, now, rx
		return greetNudge
	case rx > g.rx:
		return greetDone
	case now.Sub(g.seenAt) >= g.backoff(confirmFor):
		return greetPutBack
	}
	return greetWait
}

// followFor is how long the peer is followed from since.
func (g *greeting) followFor() time.Duration {
	if g.rekeyed {
		return rekeyFor
	}
	return greetFor
}

// backoff is wait, doubled once there was a put-back: a peer whose
// answers take longer than the first wait gets them in before the next.
// Not more: a peer that takes up a key late is due a retry soon after.
func (g *greeting) backoff(wait time.Duration) time.Duration {
	return wait << min(g.tries, 1)
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
