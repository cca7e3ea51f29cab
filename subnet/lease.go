package subnet

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
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
	// NodeAgent names the daemon that published the lease: NodeAgentTwill
	// for twilld's; empty for flanneld's, which has no such key (or an older
	// twilld's). twillctl shows which peers are still on flannel by it.
	NodeAgent string
}

// NodeAgentTwill is twilld's NodeAgent in the leases it publishes in etcd.
const NodeAgentTwill = "twill"

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
	// Since orders leases by when their record was created, in the
	// registry's terms: the etcd key's create revision, or the Node's
	// creationTimestamp in Unix seconds. Lower is older; 0 is unknown (a
	// lease made by hand). A record can be rewritten by whoever holds the
	// registry's credentials, but never made older: ClaimOrder gives what
	// two leases claim to the older one.
	Since int64
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
		if !AddByFamily(&v4, &v6, p) {
			return netip.Prefix{}, netip.Prefix{}, fmt.Errorf("subnet key %q: more than one subnet of a family", key)
		}
	}
	return v4, v6, nil
}

// AddByFamily sets *v4 or *v6 to p, whichever is p's family: a node has
// one subnet of each at most. It reports false, and sets nothing, when that
// one is set already or p is an IPv4-mapped IPv6 prefix.
func AddByFamily(v4, v6 *netip.Prefix, p netip.Prefix) bool {
	switch {
	case p.Addr().Is4() && !v4.IsValid():
		*v4 = p
	case p.Addr().Is6() && !p.Addr().Is4In6() && !v6.IsValid():
		*v6 = p
	default:
		return false
	}
	return true
}

type leaseAttrsJSON struct {
	PublicIP      string          `json:"PublicIP,omitempty"`
	PublicIPv6    *string         `json:"PublicIPv6"`
	BackendType   string          `json:"BackendType"`
	BackendData   json.RawMessage `json:"BackendData"`
	BackendV6Data json.RawMessage `json:"BackendV6Data"`
	NodeAgent     string          `json:"NodeAgent,omitempty"`
}

// MarshalJSON writes flannel's layout.
func (a LeaseAttrs) MarshalJSON() ([]byte, error) {
	j := leaseAttrsJSON{BackendType: a.BackendType, BackendData: a.BackendData, BackendV6Data: a.BackendV6Data, NodeAgent: a.NodeAgent}
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
			return LeaseAttrs{}, fmt.Errorf("lease attributes: PublicIP %q: not an IPv4 address", truncate(j.PublicIP))
		}
		if !ip.IsUnspecified() {
			a.PublicIP = ip
		}
	}
	if j.PublicIPv6 != nil && *j.PublicIPv6 != "" {
		ip, err := netip.ParseAddr(*j.PublicIPv6)
		if err != nil || !ip.Is6() || ip.Is4In6() {
			return LeaseAttrs{}, fmt.Errorf("lease attributes: PublicIPv6 %q: not an IPv6 address", truncate(*j.PublicIPv6))
		}
		a.PublicIPv6 = ip
	}
	if !a.PublicIP.IsValid() && !a.PublicIPv6.IsValid() {
		return LeaseAttrs{}, errors.New(`lease attributes: PublicIP "": a lease needs a public address`)
	}
	if j.BackendType == "" {
		return LeaseAttrs{}, errors.New(`lease attributes: BackendType "": must not be empty`)
	}
	if !shortName(j.BackendType) {
		return LeaseAttrs{}, fmt.Errorf("lease attributes: BackendType %q: at most 63 letters, digits, '-', '.' or '_'", truncate(j.BackendType))
	}
	a.BackendType = j.BackendType
	var err error
	if a.BackendData, err = backendData("BackendData", j.BackendData); err != nil {
		return LeaseAttrs{}, err
	}
	if a.BackendV6Data, err = backendData("BackendV6Data", j.BackendV6Data); err != nil {
		return LeaseAttrs{}, err
	}
	if !shortName(j.NodeAgent) {
		return LeaseAttrs{}, fmt.Errorf("lease attributes: NodeAgent %q: at most 63 letters, digits, '-', '.' or '_'", truncate(j.NodeAgent))
	}
	a.NodeAgent = j.NodeAgent
	return a, nil
}

// shortName reports whether s is at most 63 letters, digits, '-', '.' or
// '_' (or empty): a backend's or a node agent's name.
func shortName(s string) bool {
	return len(s) <= 63 && strings.Trim(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-._") == ""
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
	return a.PublicIP == b.PublicIP && a.PublicIPv6 == b.PublicIPv6 && a.BackendType == b.BackendType && a.NodeAgent == b.NodeAgent &&
		jsonEqual(a.BackendData, b.BackendData) && jsonEqual(a.BackendV6Data, b.BackendV6Data)
}

func jsonEqual(a, b json.RawMessage) bool {
	na := len(bytes.TrimSpace(a)) == 0 || string(bytes.TrimSpace(a)) == "null"
	nb := len(bytes.TrimSpace(b)) == 0 || string(bytes.TrimSpace(b)) == "null"
	if na || nb {
		return na == nb
	}
	a, b = bytes.TrimSpace(a), bytes.TrimSpace(b)
	if bytes.Equal(a, b) {
		return true
	}
	// encoding/json writes <, > and & in strings as \u003c, \u003e and
	// \u0026: a value read back from its own encoding is the same value.
	var ea, eb bytes.Buffer
	json.HTMLEscape(&ea, a)
	json.HTMLEscape(&eb, b)
	return bytes.Equal(ea.Bytes(), eb.Bytes())
}
