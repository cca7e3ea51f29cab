package hostport

import (
	"encoding/binary"
	"net/netip"
	"slices"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"

	"github.com/twill-net/twill/nl/nftsync"
)

// TableName is the inet table the host ports live in.
const TableName = "twill-hostport"

// The table's chains.
const (
	hostportsChain = "hostports"
	loopbackChain  = "loopback"
	hairpinChain   = "hairpin"
)

var (
	table    = &nftables.Table{Family: nftables.TableFamilyINet, Name: TableName}
	dstnat   = nftables.ChainPriorityNATDest
	srcnat   = nftables.ChainPriorityNATSource
	accept   = nftables.ChainPolicyAccept
	pre      = &nftables.Chain{Table: table, Name: "prerouting", Type: nftables.ChainTypeNAT, Hooknum: nftables.ChainHookPrerouting, Priority: dstnat, Policy: &accept}
	out      = &nftables.Chain{Table: table, Name: "output", Type: nftables.ChainTypeNAT, Hooknum: nftables.ChainHookOutput, Priority: dstnat, Policy: &accept}
	post     = &nftables.Chain{Table: table, Name: "postrouting", Type: nftables.ChainTypeNAT, Hooknum: nftables.ChainHookPostrouting, Priority: srcnat, Policy: &accept}
	hostport = &nftables.Chain{Table: table, Name: hostportsChain}
	loopback = &nftables.Chain{Table: table, Name: loopbackChain}
	hairpin  = &nftables.Chain{Table: table, Name: hairpinChain}
)

// ipsDstNAT is conntrack's status bit for a connection whose destination
// was translated.
const ipsDstNAT = 1 << 5

func rule(c *nftables.Chain, comment string, es ...expr.Any) *nftables.Rule {
	return &nftables.Rule{Table: table, Chain: c, Exprs: es, UserData: nftsync.Comment(comment)}
}

func cmpEq(data []byte) *expr.Cmp { return &expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: data} }

// baseRules are the hooks' rules: every packet to a local address looks
// at the host ports, but for loopback in output, which looks only at the
// host ports bound to a loopback address (a host port with no address is
// served on the node's addresses, not on 127.0.0.1 or ::1); a translated
// connection's reply path looks at the hairpins, and one from a loopback
// source leaves with the node's address (the kernel would drop it as a
// martian otherwise).
func baseRules() []*nftables.Rule {
	local := []expr.Any{
		&expr.Fib{Register: 1, FlagDADDR: true, ResultADDRTYPE: true},
		cmpEq(binaryutil.NativeEndian.PutUint32(unix.RTN_LOCAL)),
		&expr.Verdict{Kind: expr.VerdictJump, Chain: hostportsChain},
	}
	toLoopback := &expr.Verdict{Kind: expr.VerdictGoto, Chain: loopbackChain}
	dnatted := []expr.Any{
		&expr.Ct{Register: 1, Key: expr.CtKeySTATUS},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: binaryutil.NativeEndian.PutUint32(ipsDstNAT), Xor: make([]byte, 4)},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: make([]byte, 4)},
	}
	loopSrc := append(append(family(netip.IPv4Unspecified()), dnatted...), loopback4(false)...)
	return []*nftables.Rule{
		rule(pre, "to a local address", local...),
		rule(out, "IPv4 loopback: only the host ports bound to it", append(append(family(netip.IPv4Unspecified()), loopback4(true)...), toLoopback)...),
		rule(out, "IPv6 loopback: only the host ports bound to it", append(append(family(netip.IPv6Unspecified()), daddr(netip.IPv6Loopback())...), toLoopback)...),
		rule(out, "to a local address", local...),
		rule(post, "translated to a host port's pod", append(slices.Clone(dnatted), &expr.Verdict{Kind: expr.VerdictJump, Chain: hairpinChain})...),
		rule(post, "translated to a host port's pod from a loopback address", append(loopSrc, &expr.Masq{})...),
	}
}

// loopback4 matches an IPv4 loopback destination (or source).
func loopback4(dst bool) []expr.Any {
	off := uint32(16)
	if !dst {
		off = 12
	}
	return []expr.Any{
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: off, Len: 4},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: []byte{255, 0, 0, 0}, Xor: []byte{0, 0, 0, 0}},
		cmpEq([]byte{127, 0, 0, 0}),
	}
}

// family matches packets of ip's family.
func family(ip netip.Addr) []expr.Any {
	proto := byte(unix.NFPROTO_IPV4)
	if ip.Is6() {
		proto = unix.NFPROTO_IPV6
	}
	return []expr.Any{&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1}, cmpEq([]byte{proto})}
}

// addrField matches the network header's source or destination address.
func addrField(ip netip.Addr, src bool) []expr.Any {
	off, n := uint32(16), uint32(4)
	if ip.Is6() {
		off, n = 24, 16
	}
	if src {
		off -= n
	}
	return []expr.Any{&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: off, Len: n}, cmpEq(ip.AsSlice())}
}

func daddr(ip netip.Addr) []expr.Any { return addrField(ip, false) }

func port(p uint16) []byte { return binary.BigEndian.AppendUint16(nil, p) }

// podRules are the pod's rules: a DNAT rule for each mapping and each of
// its addresses the mapping serves (in the loopback chain for a mapping
// bound to a loopback address), and a hairpin masquerade for each address
// with a mapping.
func podRules(owner string, ips []netip.Addr, ports []Port) []*nftables.Rule {
	var rs []*nftables.Rule
	for _, ip := range ips {
		served := false
		for _, p := range ports {
			if !p.appliesTo(ip) {
				continue
			}
			served = true
			to := netip.AddrPortFrom(ip, p.ContainerPort)
			c := hostport
			if p.HostIP.IsLoopback() {
				c = loopback
			}
			rs = append(rs, rule(c, owner+" "+p.String()+" to "+to.String(), dnatExprs(ip, p)...))
		}
		if served {
			es := append(family(ip), addrField(ip, true)...)
			es = append(es, daddr(ip)...)
			rs = append(rs, rule(hairpin, owner+" "+ip.String(), append(es, &expr.Masq{})...))
		}
	}
	return rs
}

func dnatExprs(ip netip.Addr, p Port) []expr.Any {
	es := family(ip)
	if p.HostIP.IsValid() && !p.HostIP.IsUnspecified() {
		es = append(es, daddr(p.HostIP)...)
	}
	nfproto := uint32(unix.NFPROTO_IPV4)
	if ip.Is6() {
		nfproto = unix.NFPROTO_IPV6
	}
	return append(es,
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
		cmpEq([]byte{p.Proto}),
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
		cmpEq(port(p.HostPort)),
		&expr.Immediate{Register: 1, Data: ip.AsSlice()},
		&expr.Immediate{Register: 2, Data: port(p.ContainerPort)},
		&expr.NAT{Type: expr.NATTypeDestNAT, Family: nfproto, RegAddrMin: 1, RegAddrMax: 1, RegProtoMin: 2, RegProtoMax: 2, Specified: true}, // Max as the kernel reads it back
	)
}
