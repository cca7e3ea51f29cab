package subnet

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"strings"

	"github.com/twill-net/twill/internal/strictjson"
)

// DefaultBackend is the backend used when net-conf.json has no Backend.
const DefaultBackend = "vxlan"

// Config is the cluster network configuration, read from net-conf.json. Its
// field names are flannel's, so a flannel net-conf.json is accepted as is.
type Config struct {
	EnableIPv4    bool
	EnableIPv6    bool
	Network       netip.Prefix
	SubnetLen     int
	SubnetMin     netip.Addr
	SubnetMax     netip.Addr
	IPv6Network   netip.Prefix
	IPv6SubnetLen int
	IPv6SubnetMin netip.Addr
	IPv6SubnetMax netip.Addr
	// PublicIPRanges, when not empty, are the prefixes every node's public
	// address lies in (the node networks): a peer publishing another is
	// refused. Per family: an IPv6 address is checked only against the
	// IPv6 prefixes, if any.
	PublicIPRanges []netip.Prefix
	// EnableNFTables is flannel's netfilter switch, kept for migration:
	// when set it chooses the nftables (true) or iptables (false) mode,
	// unless twilld's --netfilter names one. Nil when absent.
	EnableNFTables *bool
	// BackendType is Backend.Type, or DefaultBackend.
	BackendType string
	// Backend is the raw Backend object; each backend decodes it strictly.
	Backend json.RawMessage
}

// rawConfig mirrors net-conf.json. encoding/json matches keys to these
// fields case-insensitively, which is what makes keys case-insensitive.
type rawConfig struct {
	EnableIPv4     *bool
	EnableIPv6     bool
	Network        string
	SubnetLen      int
	SubnetMin      string
	SubnetMax      string
	IPv6Network    string
	IPv6SubnetLen  int
	IPv6SubnetMin  string
	IPv6SubnetMax  string
	PublicIPRanges []string
	EnableNFTables *bool
	Backend        json.RawMessage
}

// ConfigError is a rejected net-conf.json field.
type ConfigError struct {
	Field  string
	Value  any
	Reason string
}

func (e *ConfigError) Error() string {
	return fmt.Sprintf("net-conf.json: %s %q: %s", e.Field, fmt.Sprint(e.Value), e.Reason)
}

func fieldErr(field string, value any, format string, args ...any) error {
	return &ConfigError{Field: field, Value: value, Reason: fmt.Sprintf(format, args...)}
}

// ErrInvalidConfig is wrapped by every ParseConfig error: the
// configuration is there but wrong, so waiting will not fix it.
var ErrInvalidConfig = errors.New("invalid network configuration")

// ErrLeaseGone is wrapped by a subnet manager's Run when the node's own
// lease is gone while it runs (Kubernetes: its Node deleted, or its
// podCIDR changed): the daemon takes subnet.env away and stops, to start
// over on the next lease.
var ErrLeaseGone = errors.New("this node's lease is gone")

// ParseConfig decodes and validates net-conf.json, filling in defaults.
// Unknown top-level keys are rejected; the Backend object is checked only
// for its Type here, the backend decodes the rest. Errors wrap
// ErrInvalidConfig and name the field and value.
func ParseConfig(data []byte) (*Config, error) {
	c, err := parseConfig(data)
	if err != nil {
		return nil, invalidConfig{err}
	}
	return c, nil
}

// invalidConfig marks an error as ErrInvalidConfig without changing its text.
type invalidConfig struct{ error }

func (e invalidConfig) Unwrap() []error { return []error{e.error, ErrInvalidConfig} }

func parseConfig(data []byte) (*Config, error) {
	var (
		raw rawConfig
		obj json.RawMessage
	)
	dec := json.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(&obj); err != nil {
		return nil, fmt.Errorf("net-conf.json: decoding: %w", err)
	}
	if dec.More() {
		return nil, errors.New("net-conf.json: decoding: trailing data after the JSON object")
	}
	if err := strictjson.Decode(obj, &raw, ""); err != nil {
		return nil, fmt.Errorf("net-conf.json: %w", err)
	}
	cfg := &Config{EnableIPv4: true, EnableIPv6: raw.EnableIPv6, EnableNFTables: raw.EnableNFTables, Backend: raw.Backend}
	if raw.EnableIPv4 != nil {
		cfg.EnableIPv4 = *raw.EnableIPv4
	}
	if !cfg.EnableIPv4 && !cfg.EnableIPv6 {
		return nil, fieldErr("EnableIPv4", false, "at least one of EnableIPv4 and EnableIPv6 must be true")
	}
	if cfg.EnableIPv4 {
		r, err := parseFamily(ipv4Family, raw.Network, raw.SubnetLen, raw.SubnetMin, raw.SubnetMax)
		if err != nil {
			return nil, err
		}
		cfg.Network, cfg.SubnetLen, cfg.SubnetMin, cfg.SubnetMax = r.network, r.subnetLen, r.min, r.max
	}
	if cfg.EnableIPv6 {
		r, err := parseFamily(ipv6Family, raw.IPv6Network, raw.IPv6SubnetLen, raw.IPv6SubnetMin, raw.IPv6SubnetMax)
		if err != nil {
			return nil, err
		}
		cfg.IPv6Network, cfg.IPv6SubnetLen, cfg.IPv6SubnetMin, cfg.IPv6SubnetMax = r.network, r.subnetLen, r.min, r.max
	}
	for _, r := range raw.PublicIPRanges {
		p, err := netip.ParsePrefix(r)
		if err != nil {
			return nil, fieldErr("PublicIPRanges", r, "not a CIDR: %v", err)
		}
		if p.Masked() != p {
			return nil, fieldErr("PublicIPRanges", r, "has host bits set (did you mean %s?)", p.Masked())
		}
		cfg.PublicIPRanges = append(cfg.PublicIPRanges, p)
	}
	bt, err := backendType(raw.Backend)
	if err != nil {
		return nil, err
	}
	cfg.BackendType = bt
	return cfg, nil
}

// backendType reads Backend.Type (case-insensitive key) without judging the
// backend's other keys.
func backendType(raw json.RawMessage) (string, error) {
	if len(bytes.TrimSpace(raw)) == 0 || string(bytes.TrimSpace(raw)) == "null" {
		return DefaultBackend, nil
	}
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(raw, &obj); err != nil {
		return "", fieldErr("Backend", string(raw), "must be a JSON object: %v", err)
	}
	for k, v := range obj {
		if !strings.EqualFold(k, "Type") {
			continue
		}
		var t string
		if err := json.Unmarshal(v, &t); err != nil {
			return "", fieldErr("Backend.Type", string(v), "must be a string")
		}
		if t == "" {
			return "", fieldErr("Backend.Type", t, "must not be empty")
		}
		return t, nil
	}
	return DefaultBackend, nil
}

// family is one address family's settings: their names in net-conf.json,
// and its limits.
type family struct {
	net, len, min, max string
	v6                 bool
	maxLen, defaultLen int
}

var (
	ipv4Family = family{net: "Network", len: "SubnetLen", min: "SubnetMin", max: "SubnetMax", maxLen: 30, defaultLen: 24}
	ipv6Family = family{
		net: "IPv6Network", len: "IPv6SubnetLen", min: "IPv6SubnetMin", max: "IPv6SubnetMax",
		v6: true, maxLen: 126, defaultLen: 64,
	}
)

type familyResult struct {
	network   netip.Prefix
	subnetLen int
	min, max  netip.Addr
}

func parseFamily(f family, network string, subnetLen int, minS, maxS string) (familyResult, error) {
	var r familyResult
	if network == "" {
		return r, fieldErr(f.net, network, "is required")
	}
	p, err := netip.ParsePrefix(network)
	if err != nil {
		return r, fieldErr(f.net, network, "not a CIDR: %v", err)
	}
	if p.Addr().Is6() != f.v6 || p.Addr().Is4In6() {
		want := "an IPv4"
		if f.v6 {
			want = "an IPv6"
		}
		return r, fieldErr(f.net, network, "must be %s CIDR", want)
	}
	if p.Masked() != p {
		return r, fieldErr(f.net, network, "has host bits set (did you mean %s?)", p.Masked())
	}
	r.network = p
	switch {
	case subnetLen == 0:
		// Each node gets a /24 (/64) unless the Network is too small for
		// a useful number of those; then it is halved.
		if p.Bits() <= f.defaultLen-2 {
			subnetLen = f.defaultLen
		} else {
			subnetLen = p.Bits() + 1
		}
		if subnetLen > f.maxLen {
			return r, fieldErr(f.net, network, "is too small to split into node subnets")
		}
	case subnetLen <= p.Bits() || subnetLen > f.maxLen:
		return r, fieldErr(f.len, subnetLen, "must be between %d and %d for %s %s", p.Bits()+1, f.maxLen, f.net, p)
	}
	r.subnetLen = subnetLen

	first := p.Addr()
	last := lastSubnet(p, subnetLen)
	// By default the first subnet is left unused (flannel does the same:
	// it keeps .0.0/24 free for infrastructure that expects it).
	r.min, r.max = nextSubnet(first, subnetLen), last
	if !r.min.IsValid() || !p.Contains(r.min) {
		r.min = first
	}
	for _, b := range []struct {
		name string
		s    string
		dst  *netip.Addr
	}{{f.min, minS, &r.min}, {f.max, maxS, &r.max}} {
		if b.s == "" {
			continue
		}
		a, err := netip.ParseAddr(b.s)
		if err != nil {
			return r, fieldErr(b.name, b.s, "not an IP address: %v", err)
		}
		if !p.Contains(a) {
			return r, fieldErr(b.name, b.s, "is outside %s %s", f.net, p)
		}
		if netip.PrefixFrom(a, subnetLen).Masked().Addr() != a {
			return r, fieldErr(b.name, b.s, "is not aligned to the subnet length /%d", subnetLen)
		}
		*b.dst = a
	}
	if r.max.Less(r.min) {
		return r, fieldErr(f.max, r.max, "is below %s %s", f.min, r.min)
	}
	return r, nil
}

// ForFamilies places a node's backend data d in the lease fields
// (BackendData, BackendV6Data) of the pod families the cluster has.
func (c *Config) ForFamilies(d json.RawMessage) (v4, v6 json.RawMessage) {
	if c.EnableIPv4 {
		v4 = d
	}
	if c.EnableIPv6 {
		v6 = d
	}
	return v4, v6
}

// SubnetCount is the number of node subnets between SubnetMin and SubnetMax.
// It saturates at 1<<62.
func (c *Config) SubnetCount() uint64 {
	return subnetsBetween(c.SubnetMin, c.SubnetMax, c.SubnetLen)
}

// Contains reports whether a lease subnet is a well-formed member of the
// IPv4 Network: inside it and of exactly SubnetLen.
func (c *Config) Contains(s netip.Prefix) bool {
	return s.IsValid() && s.Bits() == c.SubnetLen && s.Masked() == s && c.Network.Contains(s.Addr())
}

// ContainsV6 is Contains for the IPv6 network.
func (c *Config) ContainsV6(s netip.Prefix) bool {
	return s.IsValid() && s.Bits() == c.IPv6SubnetLen && s.Masked() == s && c.IPv6Network.Contains(s.Addr())
}
