package vxlan

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/twill-net/twill/internal/atomicfile"
	"github.com/twill-net/twill/subnet"
)

// The VTEP MAC and the node's identity.
//
// A node's VTEP MAC must be unique in the cluster, and stay the same across
// restarts. It is derived from the node's identity (the external
// interface's MAC, the public IP, the VNI) and kept in the state directory
// with that identity. A state directory copied to another machine (a node
// image with /var/lib/twill baked in) holds another node's identity, so its
// MAC is not trusted: the node derives its own. Should two nodes still
// publish one MAC (nodes cloned down to their interface MACs and public
// address, or a MAC taken by hand), the node whose subnet is the higher
// picks a random MAC, keeps it in its state, and publishes it; meanwhile
// every node refuses the peers whose MAC is not theirs alone, rather than
// send one node's traffic to another.

// macState is the state file's content.
type macState struct {
	VtepMAC  string `json:"VtepMAC"`
	Identity string `json:"Identity"`
}

func (b *Backend) macPath() string {
	return filepath.Join(b.opts.StateDir, fmt.Sprintf("vxlan-%d.mac", b.cfg.VNI))
}

// Identity names the machine a VTEP MAC was chosen on.
func Identity(extMAC net.HardwareAddr, publicIP netip.Addr, vni int) string {
	sum := sha256.Sum256(fmt.Appendf(nil, "twill-vtep/%x/%s/%d", []byte(extMAC), publicIP, vni))
	return hex.EncodeToString(sum[:16])
}

func (b *Backend) identity() string {
	ext := b.opts.ExtIface
	return Identity(ext.Link.HardwareAddr, ext.PublicIP, b.cfg.VNI)
}

// derivedMAC is the MAC this node's identity gives.
func (b *Backend) derivedMAC() net.HardwareAddr {
	ext := b.opts.ExtIface
	sum := sha256.Sum256(fmt.Appendf(nil, "twill-vtep/%x/%s/%d", []byte(ext.Link.HardwareAddr), ext.PublicIP, b.cfg.VNI))
	return localMAC(sum[:6])
}

// localMAC makes 6 bytes a unicast, locally administered MAC.
func localMAC(b []byte) net.HardwareAddr {
	mac := net.HardwareAddr(bytes.Clone(b[:6]))
	mac[0] = mac[0]&0xfe | 0x02
	return mac
}

// vtepMAC returns the MAC kept in the state directory when it was chosen on
// this machine, and otherwise the derived one (stored for next time).
func (b *Backend) vtepMAC() (net.HardwareAddr, error) {
	path := b.macPath()
	derived := b.derivedMAC()
	if raw, err := os.ReadFile(path); err == nil {
		var st macState
		if json.Unmarshal(raw, &st) != nil {
			// The format before identities: a bare MAC, trusted only if
			// this machine would derive it.
			st = macState{VtepMAC: strings.TrimSpace(string(raw))}
			if st.VtepMAC == derived.String() {
				st.Identity = b.identity()
			}
		}
		mac, perr := net.ParseMAC(st.VtepMAC)
		switch {
		case perr != nil || len(mac) != 6:
			b.log.Warn("ignoring an unreadable VTEP MAC file", "path", path)
		case st.Identity != b.identity():
			b.log.Warn("the stored VTEP MAC was chosen on another machine (a copied state directory?); using this machine's own",
				"path", path, "stored", mac, "mac", derived)
		default:
			return mac, nil
		}
	}
	b.storeMAC(derived)
	return derived, nil
}

// storeMAC keeps mac, with this machine's identity, in the state directory.
func (b *Backend) storeMAC(mac net.HardwareAddr) {
	if b.opts.StateDir == "" {
		return
	}
	data, _ := json.Marshal(macState{VtepMAC: mac.String(), Identity: b.identity()})
	if err := atomicfile.Write(b.macPath(), append(data, '\n'), 0o600); err != nil {
		b.log.Warn("could not store the VTEP MAC; it is derived again next time", "path", b.macPath(), "err", err)
	}
}

// macScreen is what screenMACs found in one pass over the peers.
type macScreen struct {
	refused []string // "<lease>: <why>", sorted
	// takeNew is set when this node must give up its MAC: a peer with a
	// lower subnet publishes it too.
	takeNew string
}

// screenMACs drops from peers (in place) every overlay peer whose VTEP MAC
// is not its alone: shared with another peer, or with this node. mac reads
// a peer's VTEP MAC (PeerMAC, cached by the caller).
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
		if bytes.Equal(hw, own) {
			for _, i := range idx {
				if primary(peers[i]).Addr().Less(primary(local).Addr()) {
					sc.takeNew = peers[i].String()
				} else {
					drop[i] = fmt.Sprintf("VTEP MAC %s is this node's too (%s keeps it; the peer must pick another)", hw, local.String())
				}
			}
		}
		if len(idx) > 1 {
			keys := make([]string, len(idx))
			for j, i := range idx {
				keys[j] = peers[i].String()
			}
			for _, i := range idx {
				drop[i] = fmt.Sprintf("VTEP MAC %s is published by %d nodes (%s); refusing them until each has its own",
					hw, len(idx), strings.Join(keys, ", "))
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

// randomMAC is a new locally administered MAC that none of taken uses.
func randomMAC(taken func(net.HardwareAddr) bool) net.HardwareAddr {
	for {
		var b [6]byte
		_, _ = rand.Read(b[:])
		if m := localMAC(b[:]); !taken(m) {
			return m
		}
	}
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

// BackendData returns the backend data to publish when it changed since
// the lease was taken (a new VTEP MAC), once.
func (n *Network) BackendData() (v4, v6 json.RawMessage, changed bool) {
	v4, v6, changed = n.pending, n.pending6, n.hasPending
	n.pending, n.pending6, n.hasPending = nil, nil, false
	return v4, v6, changed
}
