package subnet

import (
	"cmp"
	"fmt"
	"net/netip"
	"strings"
)

// PublicIPClaims is the one rule "one lease per public IP", which twilld
// (package daemon) and twillctl status (Peers) both apply. A node holds one
// lease, so a public IP belongs to one lease: the first to claim it holds
// it, and another lease that claims it is refused until the address is free
// again. This node's own addresses are never another lease's. Leases new to
// a node claim in ClaimOrder, the oldest record first; twilld, which
// remembers, lets a lease that held an address before keep it.
type PublicIPClaims struct {
	local   Lease
	holders map[netip.Addr]holder
}

// holder is who holds an address: id is the caller's name for the record
// (twilld's record key: node/<name> in Kubernetes mode), and its lease.
type holder struct {
	id    string
	lease *Lease
}

// name is how messages show a holder: its lease, after its record's id
// when that is not the lease's key.
func (h holder) name() string {
	if h.id == h.lease.Key() {
		return h.lease.String()
	}
	return h.id + " (" + h.lease.String() + ")"
}

// NewPublicIPClaims returns the claims of a node whose own lease is local,
// sized for n leases.
func NewPublicIPClaims(local Lease, n int) *PublicIPClaims {
	return &PublicIPClaims{local: local, holders: make(map[netip.Addr]holder, n)}
}

// ClaimOrder orders leases that claim one thing (a public IP, a VTEP MAC,
// a WireGuard key) oldest first: by Since where both know it (an unknown
// one after a known one), then by Key, so that whoever lists them, in
// whatever order, names the same holder. The first keeps the claim: a
// record written later to copy a node's cannot take what the node holds.
func ClaimOrder(a, b Lease) int {
	if a.Since != b.Since {
		switch {
		case a.Since == 0:
			return 1
		case b.Since == 0:
			return -1
		}
		return cmp.Compare(a.Since, b.Since)
	}
	return strings.Compare(a.Key(), b.Key())
}

// Conflict reports why l, the record named id, may not have its public IPs,
// or nil: an address is this node's, or held by another record.
func (c *PublicIPClaims) Conflict(id string, l Lease) error {
	for _, ip := range publicIPs(l) {
		if !ip.IsValid() {
			continue
		}
		if ip == c.local.Attrs.PublicIP || ip == c.local.Attrs.PublicIPv6 {
			return conflictError(ip, "this node")
		}
		if h, ok := c.holders[ip]; ok && h.id != id {
			return conflictError(ip, h.name())
		}
	}
	return nil
}

func conflictError(ip netip.Addr, by string) error {
	return fmt.Errorf("public IP %s is held by %s (one lease per node): the first holder keeps it; a lease overwritten by another client, or two nodes given one address", ip, by)
}

// Hold records the record id, with lease l, as the holder of l's public
// IPs. l is kept, not copied (tens of thousands at start-up): it must not
// change while held.
func (c *PublicIPClaims) Hold(id string, l *Lease) {
	for _, ip := range publicIPs(*l) {
		if ip.IsValid() {
			c.holders[ip] = holder{id: id, lease: l}
		}
	}
}

// Release forgets the record id as the holder of l's public IPs.
func (c *PublicIPClaims) Release(id string, l Lease) {
	for _, ip := range publicIPs(l) {
		if c.holders[ip].id == id {
			delete(c.holders, ip)
		}
	}
}

// publicIPs are the addresses a lease points its subnets at.
func publicIPs(l Lease) [2]netip.Addr {
	return [2]netip.Addr{l.Attrs.PublicIP, l.Attrs.PublicIPv6}
}
