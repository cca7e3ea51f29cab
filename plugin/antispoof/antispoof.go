// Package antispoof drops what a pod sends with a source address that is
// not its own, so that no address a policy or a peer trusts can be
// forged by a pod with CAP_NET_RAW (the runtime's default): a strict
// reverse-path check, for both families (IPv6 has no rp_filter), on the
// host end of every pod's veth, whatever the backend, the netfilter mode
// or --network-policy.
//
// The table is inet twill-antispoof:
//
//	pods        set of ifname: the host ends of the pods' veths
//	prerouting  filter hook, priority raw:
//	            iifname @pods ip6 saddr :: accept (duplicate address detection)
//	            iifname @pods fib saddr . iif oif missing counter drop
//
// The route back to a pod's own addresses leaves by its veth (the /32 and
// /128 routes the plugin adds, and fe80::/64 on the veth for its
// link-local address): a packet from any other source, another pod's
// address or one from elsewhere, fails the check. The plugin puts a pod's
// veth in the set at ADD, before the pod runs, and takes it out at DEL
// and GC; the base chain is written whole, in the same transaction as a
// pod's element, when it is not as Add writes it.
package antispoof

import (
	"bytes"
	"errors"
	"fmt"
	"slices"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"

	"github.com/twill-net/twill/nl/nft"
	"github.com/twill-net/twill/nl/nftsync"
)

// TableName is the inet table the check lives in.
const TableName = "twill-antispoof"

// SpoofedComment is the comment of the rule that drops spoofed packets
// (twilld counts them by it).
const SpoofedComment = "spoofed: from a pod, with a source address not its own"

const (
	setName   = "pods"
	chainName = "prerouting"
)

var (
	table  = &nftables.Table{Family: nftables.TableFamilyINet, Name: TableName}
	raw    = nftables.ChainPriorityRaw
	accept = nftables.ChainPolicyAccept
	pre    = &nftables.Chain{Table: table, Name: chainName, Type: nftables.ChainTypeFilter, Hooknum: nftables.ChainHookPrerouting, Priority: raw, Policy: &accept}
	pods   = &nftables.Set{Table: table, Name: setName, KeyType: nftables.TypeIFName}
)

func cmpEq(data []byte) *expr.Cmp { return &expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: data} }

// fromPod matches a packet that came in by a pod's veth.
func fromPod() []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyIIFNAME, Register: 1},
		&expr.Lookup{SourceRegister: 1, SetName: setName},
	}
}

// baseRules are the chain's rules, in order.
func baseRules() []*nftables.Rule {
	dad := append(fromPod(),
		&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1}, cmpEq([]byte{unix.NFPROTO_IPV6}),
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 8, Len: 16}, cmpEq(make([]byte, 16)),
		&expr.Verdict{Kind: expr.VerdictAccept})
	spoofed := append(fromPod(),
		&expr.Fib{Register: 1, FlagSADDR: true, FlagIIF: true, ResultOIF: true, FlagPRESENT: true}, cmpEq(make([]byte, 4)),
		&expr.Counter{},
		&expr.Verdict{Kind: expr.VerdictDrop})
	return []*nftables.Rule{
		{Table: table, Chain: pre, Exprs: dad, UserData: nftsync.Comment("a pod's duplicate address detection, from ::")},
		{Table: table, Chain: pre, Exprs: spoofed, UserData: nftsync.Comment(SpoofedComment)},
	}
}

// key is the set's key for a link name: the name, zero-padded to IFNAMSIZ.
func key(link string) []byte {
	k := make([]byte, unix.IFNAMSIZ)
	copy(k, link)
	return k
}

// Add puts the pods of the links under the check, in one transaction (with
// the table and its chain when they are not as Add writes them): the pod
// being added, and any other pod's link the caller found (a pod wired
// before the check existed, or whose element was deleted by hand).
func Add(k nft.Kernel, links ...string) error {
	for _, l := range links {
		if len(l) >= unix.IFNAMSIZ || l == "" {
			return fmt.Errorf("anti-spoofing: link name %q: not a link name", l)
		}
	}
	ok, err := baseInPlace(k)
	if err != nil {
		return err
	}
	err = k.Apply(addBatch(links, !ok))
	if err != nil && ok && errors.Is(err, unix.ENOENT) {
		// The table went between the read and the write: write it whole.
		err = k.Apply(addBatch(links, true))
	}
	if err != nil {
		return fmt.Errorf("anti-spoofing for %v: %w", links, err)
	}
	return nil
}

func addBatch(links []string, base bool) *nft.Batch {
	var b nft.Batch
	var elem []nft.Elem
	for _, l := range links {
		elem = append(elem, nft.Elem{Key: key(l)})
	}
	if base {
		b.AddTable(table)
		b.AddSet(pods, nil)
		b.AddChain(pre)
		b.FlushChain(pre)
		for _, r := range baseRules() {
			b.AddRule(r)
		}
	}
	b.AddElems(pods, elem)
	return &b
}

// baseInPlace says whether the chain holds what Add writes, in order.
func baseInPlace(k nft.Kernel) (bool, error) {
	have, err := k.Rules(table, chainName)
	if err != nil {
		return false, fmt.Errorf("reading the anti-spoofing chain: %w", err)
	}
	ok, err := nftsync.KernelRulesAre(have, baseRules())
	if err != nil {
		return false, fmt.Errorf("comparing the anti-spoofing chain with what Add writes: %w", err)
	}
	return ok, nil
}

// Members lists the links under the check, sorted (none without the
// table).
func Members(k nft.Kernel) ([]string, error) {
	t, err := k.Table(nftables.TableFamilyINet, TableName)
	if err != nil {
		return nil, fmt.Errorf("reading the anti-spoofing table: %w", err)
	}
	var out []string
	if t == nil {
		return nil, nil
	}
	for _, s := range t.Sets {
		if s.Set.Name != setName {
			continue
		}
		for _, e := range s.Elems {
			out = append(out, string(bytes.TrimRight(e.Key, "\x00")))
		}
	}
	slices.Sort(out)
	return out, nil
}

// Remove takes hostVeth's pod out of the check; one that is not in it
// (or no table) is taken out already.
func Remove(k nft.Kernel, hostVeth string) error {
	_, err := Prune(k, func(link string) bool { return link == hostVeth })
	return err
}

// Prune takes out of the check, in one transaction, the links that stale
// names, and returns them.
func Prune(k nft.Kernel, stale func(link string) bool) ([]string, error) {
	have, err := Members(k)
	if err != nil {
		return nil, err
	}
	var gone []string
	var elems []nft.Elem
	for _, l := range have {
		if stale(l) {
			gone = append(gone, l)
			elems = append(elems, nft.Elem{Key: key(l)})
		}
	}
	if len(elems) == 0 {
		return nil, nil
	}
	var b nft.Batch
	b.DelElems(pods, elems)
	if err := k.Apply(&b); err != nil && !errors.Is(err, unix.ENOENT) {
		return nil, fmt.Errorf("taking %v out of the anti-spoofing check: %w", gone, err)
	}
	return gone, nil
}

// Check says whether hostVeth's pod is under the check as Add put it.
func Check(k nft.Kernel, hostVeth string) error {
	ok, err := baseInPlace(k)
	if err != nil {
		return err
	}
	if !ok {
		return fmt.Errorf("table inet %s: chain %s is not what twill wrote", TableName, chainName)
	}
	have, err := Members(k)
	if err != nil {
		return err
	}
	if !slices.Contains(have, hostVeth) {
		return fmt.Errorf("table inet %s: %s is not in set %s (its pod's source addresses go unchecked)", TableName, hostVeth, setName)
	}
	return nil
}
