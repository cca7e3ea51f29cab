package subnet

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"
)

// LeaseAttrs is what a node publishes with its lease. The JSON form uses
// flannel's field names so that tools reading flannel's registry read ours.
type LeaseAttrs struct {
	PublicIP      netip.Addr
	PublicIPv6    netip.Addr
	BackendType   string
	BackendData   json.RawMessage
	BackendV6Data json.RawMessage
}

// Lease is one node's hold on a subnet of the cluster Network.
type Lease struct {
	Subnet     netip.Prefix // invalid when the cluster is IPv6-only
	IPv6Subnet netip.Prefix // invalid unless IPv6 is enabled
	Attrs      LeaseAttrs
	// Expiration is when the lease lapses unless renewed; zero for leases
	// that do not expire (reservations, Kubernetes nodes).
	Expiration time.Time
	// Reserved marks an operator-made reservation (etcd key with no TTL).
	Reserved bool
}

// Key is the lease's name in a registry: "10.244.1.0-24", or for a
// dual-stack lease "10.244.1.0-24&fd00:1::-64" (flannel's format).
func (l Lease) Key() string { return SubnetKey(l.Subnet, l.IPv6Subnet) }

// String is the lease's subnets in CIDR form, as logs and messages show
// them: "10.244.1.0/24", or "10.244.1.0/24,fd00:1::/64".
func (l Lease) String() string {
	var parts []string
	for _, p := range []netip.Prefix{l.Subnet, l.IPv6Subnet} {
		if p.IsValid() {
			parts = append(parts, p.String())
		}
	}
	if len(parts) == 0 {
		return "(no subnet)"
	}
	return strings.Join(parts, ",")
}

// SubnetKey formats the registry name of a subnet pair.
func SubnetKey(v4, v6 netip.Prefix) string {
	var parts []string
	if v4.IsValid() {
		parts = append(parts, v4.Addr().String()+"-"+strconv.Itoa(v4.Bits()))
	}
	if v6.IsValid() {
		parts = append(parts, v6.Addr().String()+"-"+strconv.Itoa(v6.Bits()))
	}
	return strings.Join(parts, "&")
}

// ParseSubnetKey parses a registry name made by SubnetKey.
func ParseSubnetKey(key string) (v4, v6 netip.Prefix, err error) {
	first, second, two := strings.Cut(key, "&")
	if key == "" || strings.Contains(second, "&") {
		return v4, v6, fmt.Errorf("subnet key %q: want <ip>-<len> or <ip>-<len>&<ipv6>-<len>", key)
	}
	parts := [2]string{first, second}
	for n, part := range parts {
		if n == 1 && !two {
			break
		}
		i := strings.LastIndexByte(part, '-')
		if i < 0 {
			return v4, v6, fmt.Errorf("subnet key %q: %q has no -<len>", key, part)
		}
		p, perr := netip.ParsePrefix(part[:i] + "/" + part[i+1:])
		if perr != nil {
			return v4, v6, fmt.Errorf("subnet key %q: %w", key, perr)
		}
		if p.Masked() != p {
			return v4, v6, fmt.Errorf("subnet key %q: %s has host bits set", key, p)
		}
		switch {
		case p.Addr().Is4() && !v4.IsValid():
			v4 = p
		case p.Addr().Is6() && !p.Addr().Is4In6() && !v6.IsValid():
			v6 = p
		default:
			return netip.Prefix{}, netip.Prefix{}, fmt.Errorf("subnet key %q: more than one subnet of a family", key)
		}
	}
	return v4, v6, nil
}

type leaseAttrsJSON struct {
	PublicIP      string          `json:"PublicIP,omitempty"`
	PublicIPv6    *string         `json:"PublicIPv6"`
	BackendType   string          `json:"BackendType"`
	BackendData   json.RawMessage `json:"BackendData"`
	BackendV6Data json.RawMessage `json:"BackendV6Data"`
}

// MarshalJSON writes flannel's layout.
func (a LeaseAttrs) MarshalJSON() ([]byte, error) {
	j := leaseAttrsJSON{BackendType: a.BackendType, BackendData: a.BackendData, BackendV6Data: a.BackendV6Data}
	if a.PublicIP.IsValid() {
		j.PublicIP = a.PublicIP.String()
	}
	if a.PublicIPv6.IsValid() {
		s := a.PublicIPv6.String()
		j.PublicIPv6 = &s
	}
	if len(j.BackendData) == 0 {
		j.BackendData = json.RawMessage("null")
	}
	if len(j.BackendV6Data) == 0 {
		j.BackendV6Data = json.RawMessage("null")
	}
	return json.Marshal(j)
}

// UnmarshalJSON is ParseLeaseAttrs.
func (a *LeaseAttrs) UnmarshalJSON(data []byte) error {
	v, err := ParseLeaseAttrs(data)
	if err != nil {
		return err
	}
	*a = v
	return nil
}

// ParseLeaseAttrs decodes and checks lease JSON written by any node. Unknown
// keys are tolerated (a newer node may add some); wrong values are not.
func ParseLeaseAttrs(data []byte) (LeaseAttrs, error) { return parseLeaseAttrs(data, true) }

// parseLeaseAttrs is ParseLeaseAttrs; fast tries scanLeaseAttrs first.
func parseLeaseAttrs(data []byte, fast bool) (LeaseAttrs, error) {
	if fast {
		if j, ok := scanLeaseAttrs(data); ok {
			return j.check()
		}
	}
	var j leaseAttrsJSON
	if err := json.Unmarshal(data, &j); err != nil {
		return LeaseAttrs{}, fmt.Errorf("lease attributes: decoding: %w", err)
	}
	return j.check()
}

// check turns decoded lease JSON into attributes, or says what is wrong.
func (j *leaseAttrsJSON) check() (LeaseAttrs, error) {
	var a LeaseAttrs
	if j.PublicIP != "" {
		ip, err := netip.ParseAddr(j.PublicIP)
		if err != nil || !ip.Is4() {
			return LeaseAttrs{}, fmt.Errorf("lease attributes: PublicIP %q: not an IPv4 address", j.PublicIP)
		}
		if !ip.IsUnspecified() {
			a.PublicIP = ip
		}
	}
	if j.PublicIPv6 != nil && *j.PublicIPv6 != "" {
		ip, err := netip.ParseAddr(*j.PublicIPv6)
		if err != nil || !ip.Is6() || ip.Is4In6() {
			return LeaseAttrs{}, fmt.Errorf("lease attributes: PublicIPv6 %q: not an IPv6 address", *j.PublicIPv6)
		}
		a.PublicIPv6 = ip
	}
	if !a.PublicIP.IsValid() && !a.PublicIPv6.IsValid() {
		return LeaseAttrs{}, errors.New(`lease attributes: PublicIP "": a lease needs a public address`)
	}
	if j.BackendType == "" {
		return LeaseAttrs{}, errors.New(`lease attributes: BackendType "": must not be empty`)
	}
	a.BackendType = j.BackendType
	var err error
	if a.BackendData, err = backendData("BackendData", j.BackendData); err != nil {
		return LeaseAttrs{}, err
	}
	if a.BackendV6Data, err = backendData("BackendV6Data", j.BackendV6Data); err != nil {
		return LeaseAttrs{}, err
	}
	return a, nil
}

// backendData is a copy of a BackendData value: an object, or nothing for
// null or absent.
func backendData(name string, raw json.RawMessage) (json.RawMessage, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return nil, nil
	}
	if raw[0] != '{' {
		return nil, fmt.Errorf("lease attributes: %s %s: must be a JSON object", name, truncate(string(raw)))
	}
	return append(json.RawMessage(nil), raw...), nil
}

func truncate(s string) string {
	if len(s) > 64 {
		return s[:61] + "..."
	}
	return s
}

// Same reports whether two leases call for the same kernel state: the same
// subnets and attributes (their expiry aside).
func (l Lease) Same(o Lease) bool {
	return l.Subnet == o.Subnet && l.IPv6Subnet == o.IPv6Subnet && l.Attrs.Equal(o.Attrs)
}

// Equal reports whether two attribute sets publish the same thing.
func (a LeaseAttrs) Equal(b LeaseAttrs) bool {
	return a.PublicIP == b.PublicIP && a.PublicIPv6 == b.PublicIPv6 && a.BackendType == b.BackendType &&
		jsonEqual(a.BackendData, b.BackendData) && jsonEqual(a.BackendV6Data, b.BackendV6Data)
}

func jsonEqual(a, b json.RawMessage) bool {
	na := len(bytes.TrimSpace(a)) == 0 || string(bytes.TrimSpace(a)) == "null"
	nb := len(bytes.TrimSpace(b)) == 0 || string(bytes.TrimSpace(b)) == "null"
	if na || nb {
		return na == nb
	}
	return bytes.Equal(bytes.TrimSpace(a), bytes.TrimSpace(b))
}

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

// uniqueAddrs keeps, of the peers claiming one public IP (a node has one
// lease), the one whose lease sorts first, and refuses the others; a peer
// claiming the local node's address is refused too. twilld prefers the
// peer that held the address first, which a single listing cannot tell.
func uniqueAddrs(local Lease, peers []Lease, refuse func(key, why string)) []Lease {
	holders := map[netip.Addr]string{}
	for _, ip := range [2]netip.Addr{local.Attrs.PublicIP, local.Attrs.PublicIPv6} {
		if ip.IsValid() {
			holders[ip] = "this node"
		}
	}
	order := make([]int, len(peers))
	for i := range order {
		order[i] = i
	}
	slices.SortFunc(order, func(a, b int) int { return strings.Compare(peers[a].String(), peers[b].String()) })
	drop := make([]bool, len(peers))
	for _, i := range order {
		l := peers[i]
		for _, ip := range [2]netip.Addr{l.Attrs.PublicIP, l.Attrs.PublicIPv6} {
			if h, held := holders[ip]; ip.IsValid() && held && !drop[i] {
				refuse(l.String(), fmt.Sprintf("public IP %s is held by %s (one lease per node)", ip, h))
				drop[i] = true
			}
		}
		if !drop[i] {
			for _, ip := range [2]netip.Addr{l.Attrs.PublicIP, l.Attrs.PublicIPv6} {
				if ip.IsValid() {
					holders[ip] = l.String()
				}
			}
		}
	}
	kept := peers[:0]
	for i, l := range peers {
		if !drop[i] {
			kept = append(kept, l)
		}
	}
	return kept
}
