package wireguard

import (
	"encoding/json"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"time"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"

	"github.com/twill-net/twill/nl"
	"github.com/twill-net/twill/subnet"
)

// peer is one WireGuard peer as a tunnel wants it.
type peer struct {
	key      wgtypes.Key
	endpoint netip.AddrPort
	allowed  []netip.Prefix // sorted
	lease    string
}

// desired is the pure part of Reconcile for one tunnel: the peers the
// leases call for, keyed by public key, and the leases refused, each as
// "<lease>: <why>". A key that several leases publish goes to the oldest
// (subnet.ClaimOrder), so that a lease written later to copy a node's key
// takes nothing from that node; a lease publishing this node's own key is
// refused. conflicted maps every lease of a shared key, the keeper
// included, to the key: a change to one of them can change who keeps it,
// and a lease taking that key joins them.
func desired(t tunnel, self wgtypes.Key, leases []subnet.Lease) (want map[wgtypes.Key]peer, refused []string, conflicted map[string]wgtypes.Key) {
	want = make(map[wgtypes.Key]peer, len(leases))
	holders := map[wgtypes.Key][]int{}
	conflicted = map[string]wgtypes.Key{}
	for i, l := range leases {
		p, ok, why := wantPeer(t, l)
		if why != "" {
			refused = append(refused, l.String()+": "+why)
			continue
		}
		if !ok {
			continue
		}
		holders[p.key] = append(holders[p.key], i)
		if len(holders[p.key]) == 1 {
			want[p.key] = p
		}
	}
	ownKey := self.PublicKey()
	for k, hs := range holders {
		switch {
		case k == ownKey:
			for _, i := range hs {
				refused = append(refused, leases[i].String()+": publishes this node's own WireGuard public key")
				conflicted[leases[i].String()] = k
			}
			delete(want, k)
		case len(hs) > 1:
			slices.SortFunc(hs, func(a, b int) int { return subnet.ClaimOrder(leases[a], leases[b]) })
			keeper := leases[hs[0]]
			want[k], _, _ = wantPeer(t, keeper)
			conflicted[keeper.String()] = k
			for _, i := range hs[1:] {
				refused = append(refused, leases[i].String()+": publishes the WireGuard public key of "+keeper.String()+
					" (the older lease keeps it)")
				conflicted[leases[i].String()] = k
			}
		}
	}
	slices.Sort(refused)
	return want, refused, conflicted
}

// wantPeer reads one lease for tunnel t: the peer, or ok false when the
// lease has nothing for this tunnel to carry, or why it is refused.
func wantPeer(t tunnel, l subnet.Lease) (p peer, ok bool, why string) {
	if t.pod4 && l.Subnet.IsValid() {
		p.allowed = append(p.allowed, l.Subnet.Masked())
	}
	if t.pod6 && l.IPv6Subnet.IsValid() {
		p.allowed = append(p.allowed, l.IPv6Subnet.Masked())
	}
	if len(p.allowed) == 0 {
		return peer{}, false, ""
	}
	slices.SortFunc(p.allowed, func(a, b netip.Prefix) int { return a.Addr().Compare(b.Addr()) })
	if l.Attrs.BackendType != Type {
		return peer{}, false, fmt.Sprintf("backend type %q, not %q", l.Attrs.BackendType, Type)
	}
	ip := l.Attrs.PublicIP
	if t.v6 {
		ip = l.Attrs.PublicIPv6
	}
	if err := subnet.CheckPublicIP(ip); err != nil {
		return peer{}, false, fmt.Sprintf("%s public IP %v unusable for %s: %v", famName(t.v6), ip, t.name, err)
	}
	raw := l.Attrs.BackendData
	if t.v6 && len(l.Attrs.BackendV6Data) > 0 || len(raw) == 0 || string(raw) == "null" {
		raw = l.Attrs.BackendV6Data
	}
	var d Data
	if err := json.Unmarshal(raw, &d); err != nil {
		return peer{}, false, fmt.Sprintf("backend data %q: %v", truncate(string(raw)), err)
	}
	k, err := wgtypes.ParseKey(d.PublicKey)
	if err != nil || k == (wgtypes.Key{}) {
		return peer{}, false, fmt.Sprintf("backend data PublicKey %q: not a WireGuard public key", truncate(d.PublicKey))
	}
	p.key, p.endpoint, p.lease = k, netip.AddrPortFrom(ip.Unmap(), uint16(t.port)), l.String()
	return p, true, ""
}

func truncate(s string) string {
	if len(s) > 64 {
		return s[:64] + "…"
	}
	return s
}

// routes emits the routes the peers call for through the device at link.
func routes(want map[wgtypes.Key]peer, link int, emit func(nl.Route)) {
	for _, p := range want {
		for _, a := range p.allowed {
			emit(nl.Route{Dst: a, LinkIndex: link, Scope: nl.ScopeLink})
		}
	}
}

// failClosed adds to rs a blackhole route for each pod network the tunnels
// carry, below every route through a device (less specific, and at
// twill's metric, above anyone else's default 0). While a device is
// missing (deleted, or its keeper between two pods), its routes go with
// it, and a pod's packet to another node would otherwise follow the
// node's default route onto the underlay in clear: the blackhole drops
// it. So does a peer refused, or not yet on the device.
func failClosed(ts []tunnel, cfg *subnet.Config, rs []nl.Route) []nl.Route {
	var v4, v6 bool
	for _, t := range ts {
		v4, v6 = v4 || t.pod4, v6 || t.pod6
	}
	for _, n := range []struct {
		on  bool
		net netip.Prefix
	}{{v4, cfg.Network}, {v6, cfg.IPv6Network}} {
		if n.on && n.net.IsValid() {
			rs = append(rs, nl.Route{Dst: n.net.Masked(), Type: nl.RouteBlackhole})
		}
	}
	return rs
}

// settingsFor is what every peer of a tunnel shares.
type shared struct {
	psk       wgtypes.Key // zero: none
	keepalive time.Duration
}

// plan is the change that makes the device have match the private key,
// port and peers wanted; it is empty (and n 0) when they already do.
func plan(have *wgtypes.Device, key wgtypes.Key, port int, want map[wgtypes.Key]peer, sh shared) (cfg wgtypes.Config, n int) {
	if have.PrivateKey != key {
		cfg.PrivateKey = &key
		n++
	}
	if have.ListenPort != port {
		cfg.ListenPort = &port
		n++
	}
	seen := make(map[wgtypes.Key]bool, len(have.Peers))
	for _, hp := range have.Peers {
		seen[hp.PublicKey] = true
		p, ok := want[hp.PublicKey]
		if !ok {
			cfg.Peers = append(cfg.Peers, wgtypes.PeerConfig{PublicKey: hp.PublicKey, Remove: true})
			continue
		}
		if !samePeer(hp, p, sh) {
			cfg.Peers = append(cfg.Peers, peerConfig(p, sh))
		}
	}
	for k, p := range want {
		if !seen[k] {
			cfg.Peers = append(cfg.Peers, peerConfig(p, sh))
		}
	}
	removalsLast(cfg.Peers)
	return cfg, n + len(cfg.Peers)
}

// removalsLast orders a set's peers adds and changes first: a peer moving
// its key keeps a path for as long as it can.
func removalsLast(ps []wgtypes.PeerConfig) {
	slices.SortStableFunc(ps, func(a, b wgtypes.PeerConfig) int {
		switch {
		case a.Remove == b.Remove:
			return 0
		case b.Remove:
			return -1
		}
		return 1
	})
}

func samePeer(hp wgtypes.Peer, p peer, sh shared) bool {
	if hp.PresharedKey != sh.psk || hp.PersistentKeepaliveInterval != sh.keepalive {
		return false
	}
	if hp.Endpoint == nil || hp.Endpoint.AddrPort() != p.endpoint && netip.AddrPortFrom(hp.Endpoint.AddrPort().Addr().Unmap(), hp.Endpoint.AddrPort().Port()) != p.endpoint {
		return false
	}
	if len(hp.AllowedIPs) != len(p.allowed) {
		return false
	}
	got := make([]netip.Prefix, 0, len(hp.AllowedIPs))
	for _, n := range hp.AllowedIPs {
		got = append(got, prefixOf(n))
	}
	slices.SortFunc(got, func(a, b netip.Prefix) int { return a.Addr().Compare(b.Addr()) })
	return slices.Equal(got, p.allowed)
}

func prefixOf(n net.IPNet) netip.Prefix {
	a, _ := netip.AddrFromSlice(n.IP)
	ones, _ := n.Mask.Size()
	if a.Is4In6() && ones <= 32 {
		a = a.Unmap()
	}
	return netip.PrefixFrom(a, ones)
}

func peerConfig(p peer, sh shared) wgtypes.PeerConfig {
	psk, ka := sh.psk, sh.keepalive
	pc := wgtypes.PeerConfig{
		PublicKey: p.key, Endpoint: net.UDPAddrFromAddrPort(p.endpoint), ReplaceAllowedIPs: true,
		PresharedKey: &psk, PersistentKeepaliveInterval: &ka,
	}
	for _, a := range p.allowed {
		pc.AllowedIPs = append(pc.AllowedIPs, net.IPNet{IP: a.Addr().AsSlice(), Mask: net.CIDRMask(a.Bits(), a.Addr().BitLen())})
	}
	return pc
}
