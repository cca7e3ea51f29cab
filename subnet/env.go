package subnet

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"net/netip"
	"os"
	"sort"
	"strconv"
	"strings"

	"github.com/twill-net/twill/internal/atomicfile"
)

// Env is the content of subnet.env: what the daemon holds, for the CNI plugin.
type Env struct {
	Network     netip.Prefix
	Subnet      netip.Prefix
	IPv6Network netip.Prefix
	IPv6Subnet  netip.Prefix
	MTU         int
	IPMasq      bool
	Backend     string
	// Netfilter is the mode twilld writes its rules in (iptables or
	// nftables), for twillctl status; empty in files written before it.
	Netfilter string
	// Extra holds backend-specific TWILL_* keys (for example the eni
	// backend's route table), without the TWILL_ prefix.
	Extra map[string]string
}

const envPrefix = "TWILL_"

// Marshal renders e in KEY=VALUE form with a stable key order.
func (e Env) Marshal() []byte {
	var b bytes.Buffer
	put := func(k, v string) { fmt.Fprintf(&b, "%s%s=%s\n", envPrefix, k, v) }
	if e.Network.IsValid() {
		put("NETWORK", e.Network.String())
		put("SUBNET", e.Subnet.String())
	}
	if e.IPv6Network.IsValid() {
		put("IPV6_NETWORK", e.IPv6Network.String())
		put("IPV6_SUBNET", e.IPv6Subnet.String())
	}
	put("MTU", strconv.Itoa(e.MTU))
	put("IPMASQ", strconv.FormatBool(e.IPMasq))
	put("BACKEND", e.Backend)
	if e.Netfilter != "" {
		put("NETFILTER", e.Netfilter)
	}
	keys := make([]string, 0, len(e.Extra))
	for k := range e.Extra {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		put(k, e.Extra[k])
	}
	return b.Bytes()
}

// WriteEnv writes e to path atomically: readers see the old file or the new
// one, never a part of either.
func WriteEnv(path string, e Env) error {
	return atomicfile.Write(path, e.Marshal(), 0o644)
}

// ErrNoEnv is returned (wrapped) by ReadEnv when the file does not exist:
// the daemon has not written it yet.
var ErrNoEnv = errors.New("subnet.env not written yet (is twilld running on this node?)")

// ReadEnv reads and parses the subnet.env at path.
func ReadEnv(path string) (Env, error) {
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return Env{}, fmt.Errorf("reading %s: %w", path, ErrNoEnv)
	}
	if err != nil {
		return Env{}, fmt.Errorf("reading %s: %w", path, err)
	}
	e, err := ParseEnv(data)
	if err != nil {
		return Env{}, fmt.Errorf("reading %s: %w", path, err)
	}
	return e, nil
}

// ParseEnv parses subnet.env content. Every rejection names the key and value.
func ParseEnv(data []byte) (Env, error) {
	var e Env
	seen := map[string]bool{}
	sc := bufio.NewScanner(bytes.NewReader(data))
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		if !ok {
			return Env{}, fmt.Errorf("subnet.env line %d %q: want KEY=VALUE", n, truncate(line))
		}
		if !strings.HasPrefix(k, envPrefix) {
			return Env{}, fmt.Errorf("subnet.env line %d: key %q: not a %s key", n, truncate(k), envPrefix)
		}
		k = strings.TrimPrefix(k, envPrefix)
		if seen[k] {
			return Env{}, fmt.Errorf("subnet.env line %d: key %s%s repeated", n, envPrefix, k)
		}
		seen[k] = true
		if err := e.set(k, v); err != nil {
			return Env{}, fmt.Errorf("subnet.env line %d: %w", n, err)
		}
	}
	if err := sc.Err(); err != nil {
		return Env{}, fmt.Errorf("subnet.env: %w", err)
	}
	return e, e.validate()
}

func (e *Env) set(k, v string) error {
	bad := func(why string) error { return fmt.Errorf("%s%s %q: %s", envPrefix, k, truncate(v), why) }
	prefix := func(dst *netip.Prefix, v6 bool) error {
		p, err := netip.ParsePrefix(v)
		if err != nil || p.Addr().Is6() != v6 || p.Addr().Is4In6() {
			return bad("not a CIDR of the right family")
		}
		*dst = p.Masked()
		return nil
	}
	switch k {
	case "NETWORK":
		return prefix(&e.Network, false)
	case "SUBNET":
		return prefix(&e.Subnet, false)
	case "IPV6_NETWORK":
		return prefix(&e.IPv6Network, true)
	case "IPV6_SUBNET":
		return prefix(&e.IPv6Subnet, true)
	case "MTU":
		m, err := strconv.Atoi(v)
		if err != nil || m < 68 || m > 65535 {
			return bad("must be an integer between 68 and 65535")
		}
		e.MTU = m
	case "IPMASQ":
		b, err := strconv.ParseBool(v)
		if err != nil {
			return bad("must be true or false")
		}
		e.IPMasq = b
	case "BACKEND":
		if v == "" {
			return bad("must not be empty")
		}
		e.Backend = v
	case "NETFILTER":
		if v != "iptables" && v != "nftables" {
			return bad("must be iptables or nftables")
		}
		e.Netfilter = v
	default:
		if k == "" || strings.ContainsAny(k, " \t") {
			return bad("malformed key")
		}
		if e.Extra == nil {
			e.Extra = map[string]string{}
		}
		e.Extra[k] = v
	}
	return nil
}

func (e Env) validate() error {
	if !e.Subnet.IsValid() && !e.IPv6Subnet.IsValid() {
		return errors.New("subnet.env: neither TWILL_SUBNET nor TWILL_IPV6_SUBNET is set")
	}
	if e.Subnet.IsValid() != e.Network.IsValid() {
		return errors.New("subnet.env: TWILL_NETWORK and TWILL_SUBNET must be set together")
	}
	if e.IPv6Subnet.IsValid() != e.IPv6Network.IsValid() {
		return errors.New("subnet.env: TWILL_IPV6_NETWORK and TWILL_IPV6_SUBNET must be set together")
	}
	if e.Subnet.IsValid() && !e.Network.Contains(e.Subnet.Addr()) {
		return fmt.Errorf("subnet.env: TWILL_SUBNET %q: outside TWILL_NETWORK %s", e.Subnet, e.Network)
	}
	if e.IPv6Subnet.IsValid() && !e.IPv6Network.Contains(e.IPv6Subnet.Addr()) {
		return fmt.Errorf("subnet.env: TWILL_IPV6_SUBNET %q: outside TWILL_IPV6_NETWORK %s", e.IPv6Subnet, e.IPv6Network)
	}
	if e.MTU == 0 {
		return errors.New("subnet.env: TWILL_MTU is not set")
	}
	if e.Backend == "" {
		return errors.New("subnet.env: TWILL_BACKEND is not set")
	}
	return nil
}
