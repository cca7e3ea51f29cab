package subnet

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
)

// Refusal is a registry entry that did not become a lease, with the reason.
type Refusal struct {
	Key string
	Err error
}

// Snapshot is the full set of leases a subnet manager currently knows,
// including the local node's own, plus the entries it had to refuse.
type Snapshot struct {
	Leases  []Lease
	Refused []Refusal
}

// CheckPublicIP says why ip cannot be a node's public address, the
// underlay address peers send its pods' traffic to, or returns nil. A
// rogue or broken lease must not turn into a route, a neighbour or an FDB
// entry towards an address that is no node's: unspecified, loopback,
// multicast, broadcast or link-local.
func CheckPublicIP(ip netip.Addr) error {
	var what string
	switch {
	case !ip.IsValid():
		return errors.New("no address")
	case ip.IsUnspecified():
		what = "unspecified"
	case ip.IsLoopback():
		what = "a loopback address"
	case ip.IsMulticast():
		what = "a multicast address"
	case ip == netip.AddrFrom4([4]byte{255, 255, 255, 255}):
		what = "the broadcast address"
	case ip.IsLinkLocalUnicast():
		what = "a link-local address"
	default:
		return nil
	}
	return fmt.Errorf("%s is %s, not a node's address", ip, what)
}

// CheckProgrammable reports why this node must not program a peer lease,
// or nil: CheckPeer's reasons, or a backend other than the cluster's. It is
// the one rule twilld (daemon), twillctl status and Peers apply.
func CheckProgrammable(cfg *Config, local, peer Lease) error {
	if err := CheckPeer(cfg, local, peer); err != nil {
		return err
	}
	if peer.Attrs.BackendType != cfg.BackendType {
		return fmt.Errorf("backend type %q, but this cluster runs %q", peer.Attrs.BackendType, cfg.BackendType)
	}
	return nil
}

// CheckPeer reports why a peer lease must not be programmed, or nil. It
// refuses subnets outside the Network or of the wrong length, subnets that
// overlap the local node's, leases without an address to route to, public
// addresses that cannot be a node's (CheckPublicIP), and, when the
// configuration lists PublicIPRanges, public addresses outside them.
func CheckPeer(cfg *Config, local, peer Lease) error {
	if cfg.EnableIPv4 {
		if !cfg.Contains(peer.Subnet) {
			return fmt.Errorf("subnet %s: not a /%d inside Network %s", fmtPrefix(peer.Subnet), cfg.SubnetLen, cfg.Network)
		}
		if local.Subnet.IsValid() && peer.Subnet.Overlaps(local.Subnet) {
			return fmt.Errorf("subnet %s: overlaps the local subnet %s", peer.Subnet, local.Subnet)
		}
	}
	if !peer.Attrs.PublicIP.IsValid() && !peer.Attrs.PublicIPv6.IsValid() {
		return fmt.Errorf("subnet %s: no PublicIP or PublicIPv6 to route to", peer)
	}
	if peer.Attrs.PublicIP.IsValid() {
		if err := cfg.checkPublic(peer.Attrs.PublicIP); err != nil {
			return fmt.Errorf("subnet %s: PublicIP %w", peer, err)
		}
	}
	if peer.Attrs.PublicIPv6.IsValid() {
		if err := cfg.checkPublic(peer.Attrs.PublicIPv6); err != nil {
			return fmt.Errorf("lease %s: PublicIPv6 %w", peer.Key(), err)
		}
	}
	if cfg.EnableIPv6 && peer.IPv6Subnet.IsValid() {
		if !cfg.ContainsV6(peer.IPv6Subnet) {
			return fmt.Errorf("IPv6 subnet %s: not a /%d inside IPv6Network %s", peer.IPv6Subnet, cfg.IPv6SubnetLen, cfg.IPv6Network)
		}
		if local.IPv6Subnet.IsValid() && peer.IPv6Subnet.Overlaps(local.IPv6Subnet) {
			return fmt.Errorf("IPv6 subnet %s: overlaps the local IPv6 subnet %s", peer.IPv6Subnet, local.IPv6Subnet)
		}
	}
	return nil
}

// checkPublic is CheckPublicIP and the PublicIPRanges check.
func (c *Config) checkPublic(ip netip.Addr) error {
	if err := CheckPublicIP(ip); err != nil {
		return err
	}
	var fam []netip.Prefix
	for _, r := range c.PublicIPRanges {
		if r.Addr().Is4() == ip.Is4() {
			fam = append(fam, r)
		}
	}
	if len(fam) == 0 {
		return nil
	}
	for _, r := range fam {
		if r.Contains(ip) {
			return nil
		}
	}
	return fmt.Errorf("%s is outside PublicIPRanges %v", ip, fam)
}

func fmtPrefix(p netip.Prefix) string {
	if !p.IsValid() {
		return `""`
	}
	return p.String()
}

// Peers splits a snapshot into the leases a backend may program and the
// ones it must not, with the reason (malformed, outside the Network,
// overlapping the local subnet, another backend type). The local lease is
// neither. buf is reused for the result when it has room.
func Peers(cfg *Config, local Lease, snap Snapshot, buf []Lease) (peers []Lease, refused map[string]string) {
	refuse := func(key, why string) {
		if refused == nil {
			refused = map[string]string{}
		}
		refused[key] = why
	}
	for _, r := range snap.Refused {
		refuse(r.Key, r.Err.Error())
	}
	peers = buf[:0]
	for _, l := range snap.Leases {
		if l.Subnet == local.Subnet && l.IPv6Subnet == local.IPv6Subnet {
			continue
		}
		if err := CheckProgrammable(cfg, local, l); err != nil {
			refuse(l.String(), err.Error())
			continue
		}
		peers = append(peers, l)
	}
	return uniqueAddrs(local, peers, refuse), refused
}

// uniqueAddrs keeps one lease per public IP (PublicIPClaims), the leases
// claiming in ClaimOrder, and refuses the others. twilld prefers the peer
// that held the address first, which a single listing cannot tell.
func uniqueAddrs(local Lease, peers []Lease, refuse func(key, why string)) []Lease {
	claims := NewPublicIPClaims(local, len(peers))
	order := make([]int, len(peers))
	for i := range order {
		order[i] = i
	}
	slices.SortFunc(order, func(a, b int) int { return ClaimOrder(peers[a], peers[b]) })
	drop := make([]bool, len(peers))
	for _, i := range order {
		l := peers[i]
		if err := claims.Conflict(l.Key(), l); err != nil {
			refuse(l.String(), err.Error())
			drop[i] = true
			continue
		}
		claims.Hold(l.Key(), &peers[i])
	}
	kept := peers[:0]
	for i, l := range peers {
		if !drop[i] {
			kept = append(kept, l)
		}
	}
	return kept
}
