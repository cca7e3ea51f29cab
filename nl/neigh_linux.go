package nl

import (
	"fmt"
	"net"
	"net/netip"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// NeighSet adds or replaces a neighbour entry.
func (h *Handle) NeighSet(n Neigh) error {
	state := netlink.NUD_REACHABLE
	if n.Permanent {
		state = netlink.NUD_PERMANENT
	}
	family := unix.AF_INET
	if n.IP.Is6() {
		family = unix.AF_INET6
	}
	err := h.h.NeighSet(&netlink.Neigh{LinkIndex: n.LinkIndex, Family: family, State: state, IP: n.IP.AsSlice(), HardwareAddr: n.HardwareAddr})
	if err != nil {
		return fmt.Errorf("setting neighbour %s on link #%d: %w", n.IP, n.LinkIndex, err)
	}
	return nil
}

// Neighs lists the neighbour entries of a link.
func (h *Handle) Neighs(index int, family Family) ([]Neigh, error) {
	out, err := h.neighDump(byte(family), index)
	if err != nil {
		return nil, fmt.Errorf("listing neighbours of link #%d: %w", index, err)
	}
	return out, nil
}

// neighDump lists the neighbour (AF_BRIDGE: FDB) entries of a link.
func (h *Handle) neighDump(family byte, index int) ([]Neigh, error) {
	return retryDump(func() ([]Neigh, error) {
		var out []Neigh
		err := h.dump(unix.RTM_GETNEIGH, neighDumpRequest(family, index), func(p []byte) {
			if n, ok := parseNeigh(p, family, index); ok {
				out = appendGrown(out, n)
			}
		})
		return out, err
	})
}

// FDB lists the permanent forwarding entries (MAC -> remote IP) of a
// VXLAN device.
func (h *Handle) FDB(index int) ([]Neigh, error) {
	out, err := h.neighDump(unix.AF_BRIDGE, index)
	if err != nil {
		return nil, fmt.Errorf("listing fdb of link #%d: %w", index, err)
	}
	return out, nil
}

// Rules lists the policy-routing rules of a family.
func (h *Handle) Rules(family Family) ([]Rule, error) {
	rules, err := retryDump(func() ([]netlink.Rule, error) { return h.h.RuleList(int(family)) })
	if err != nil {
		return nil, fmt.Errorf("listing rules: %w", err)
	}
	out := make([]Rule, 0, len(rules))
	for _, r := range rules {
		rule := Rule{Priority: r.Priority, Table: r.Table, Protocol: int(r.Protocol)}
		if r.Src != nil {
			rule.Src = prefixFromIPNet(r.Src)
		}
		if r.Dst != nil {
			rule.Dst = prefixFromIPNet(r.Dst)
		}
		out = append(out, rule)
	}
	return out, nil
}

func toNetlinkRule(r Rule) *netlink.Rule {
	nr := netlink.NewRule()
	nr.Priority, nr.Table, nr.Protocol = r.Priority, r.Table, uint8(r.Protocol)
	nr.Family = unix.AF_INET
	for _, p := range []netip.Prefix{r.Src, r.Dst} {
		if p.IsValid() && p.Addr().Is6() {
			nr.Family = unix.AF_INET6
		}
	}
	if r.Src.IsValid() {
		nr.Src = &net.IPNet{IP: r.Src.Addr().AsSlice(), Mask: net.CIDRMask(r.Src.Bits(), r.Src.Addr().BitLen())}
	}
	if r.Dst.IsValid() {
		nr.Dst = &net.IPNet{IP: r.Dst.Addr().AsSlice(), Mask: net.CIDRMask(r.Dst.Bits(), r.Dst.Addr().BitLen())}
	}
	return nr
}

// RuleAdd adds a rule; an identical rule already present is not an error.
func (h *Handle) RuleAdd(r Rule) error {
	return unlessAlready(h.h.RuleAdd(toNetlinkRule(r)), unix.EEXIST, "adding rule %s", r)
}

// RuleDel deletes a rule; an absent rule is not an error.
func (h *Handle) RuleDel(r Rule) error {
	return unlessAlready(h.h.RuleDel(toNetlinkRule(r)), unix.ENOENT, "deleting rule %s", r)
}
