package vxlan

import (
	"bytes"
	"fmt"
	"net"
	"slices"

	"github.com/twill-net/twill/subnet"
)

// macScreen is what screenMACs found in one pass over the peers.
type macScreen struct {
	refused []string // "<lease>: <why>", sorted
	// takeNew is set when this node must give up its MAC: an older lease
	// publishes it too.
	takeNew string
}

// screenMACs drops from peers every overlay peer whose VTEP MAC another
// lease, older in subnet.ClaimOrder, publishes too: another peer's, or
// this node's. The oldest keeps it. mac reads a peer's VTEP MAC (PeerMAC,
// cached by the caller).
func screenMACs(local subnet.Lease, own net.HardwareAddr, peers []subnet.Lease, direct func(subnet.Lease) bool,
	mac func(subnet.Lease) (net.HardwareAddr, error), seen map[[6]byte]struct{}) ([]subnet.Lease, macScreen) {
	var sc macScreen
	if allDistinct(own, peers, direct, mac, seen) {
		return peers, sc // the common case, without allocating
	}
	holders := make(map[[6]byte][]int, len(peers))
	for i, p := range peers {
		if direct(p) {
			continue
		}
		m, err := mac(p)
		if err != nil || len(m) != 6 {
			continue // refused later, for its data
		}
		holders[[6]byte(m)] = append(holders[[6]byte(m)], i)
	}
	drop := map[int]string{}
	for m, idx := range holders {
		hw := net.HardwareAddr(m[:])
		// The oldest lease keeps the MAC (subnet.ClaimOrder): one written
		// later to copy a node's never takes it from that node.
		slices.SortFunc(idx, func(a, b int) int { return subnet.ClaimOrder(peers[a], peers[b]) })
		keeper, mine := idx[0], false // mine: this node keeps it
		if bytes.Equal(hw, own) {
			if subnet.ClaimOrder(peers[keeper], local) < 0 {
				sc.takeNew = peers[keeper].String()
			} else {
				mine = true
			}
		}
		for _, i := range idx {
			switch {
			case mine:
				drop[i] = fmt.Sprintf("VTEP MAC %s is this node's too (%s, the older lease, keeps it; the peer must pick another)", hw, local.String())
			case i != keeper:
				drop[i] = fmt.Sprintf("VTEP MAC %s is %s's too (the older lease keeps it); refused until this lease has its own", hw, peers[keeper].String())
			}
		}
	}
	if len(drop) == 0 {
		return peers, sc
	}
	// A new slice: peers is the caller's, and it may use it again.
	kept := make([]subnet.Lease, 0, len(peers)-len(drop))
	for i, p := range peers {
		if why, ok := drop[i]; ok {
			sc.refused = append(sc.refused, p.String()+": "+why)
			continue
		}
		kept = append(kept, p)
	}
	slices.Sort(sc.refused)
	return kept, sc
}

// allDistinct reports whether every overlay peer's MAC is its alone and
// none is own. seen is scratch space, reused between calls (nil: made
// here).
func allDistinct(own net.HardwareAddr, peers []subnet.Lease, direct func(subnet.Lease) bool,
	mac func(subnet.Lease) (net.HardwareAddr, error), seen map[[6]byte]struct{}) bool {
	if seen == nil {
		seen = make(map[[6]byte]struct{}, len(peers))
	}
	clear(seen)
	if len(own) == 6 {
		seen[[6]byte(own)] = struct{}{}
	}
	for _, p := range peers {
		if direct(p) {
			continue
		}
		m, err := mac(p)
		if err != nil || len(m) != 6 {
			continue
		}
		if _, dup := seen[[6]byte(m)]; dup {
			return false
		}
		seen[[6]byte(m)] = struct{}{}
	}
	return true
}

// screen drops the peers whose VTEP MAC is not theirs alone, and takes a
// new MAC when a peer that keeps it publishes this node's. It reports
// whether this node's MAC changed.
func (n *Network) screen(peers []subnet.Lease) ([]subnet.Lease, bool) {
	l := n.view(0)
	own := n.b.dev.HardwareAddr
	if n.macSeen == nil {
		n.macSeen = map[[6]byte]struct{}{}
	}
	peers, sc := screenMACs(n.local, own, peers, func(p subnet.Lease) bool { return !l.overlay(p) }, n.peerMAC, n.macSeen)
	n.macRefused.Report(sc.refused)
	n.macShared = len(sc.refused) > 0
	if sc.takeNew == "" {
		return peers, false
	}
	inUse := map[string]bool{}
	for _, e := range n.parsed {
		if e.err == nil {
			inUse[e.mac.String()] = true
		}
	}
	mac := randomMAC(func(m net.HardwareAddr) bool { return inUse[m.String()] })
	n.b.log.Warn("this node's VTEP MAC is published by another node too (a cloned machine?); choosing a new one and publishing it",
		"mac", own, "peer", sc.takeNew, "new_mac", mac)
	n.b.dev.HardwareAddr = mac
	n.b.storeMAC(mac)
	n.pending, n.pending6 = n.b.data(mac)
	n.hasPending = true
	n.recs = nil
	return peers, true
}

// macClash reports whether an upserted overlay peer's MAC is this node's
// or another programmed peer's.
func (n *Network) macClash(upserted []subnet.Lease) bool {
	l := n.view(n.devIdx)
	own := n.b.dev.HardwareAddr
	for _, p := range upserted {
		if !l.overlay(p) {
			continue
		}
		m, err := n.peerMAC(p)
		if err != nil || len(m) != 6 {
			continue // refused for its data, alone
		}
		if slices.Equal(m, own) {
			return true
		}
		held := n.macs[[6]byte(m)]
		if old := n.recs[recKey(p)]; old != nil && old.objects.Overlay && slices.Equal(old.objects.FDB.HardwareAddr, m) {
			held--
		}
		if held > 0 {
			return true
		}
	}
	return false
}
