// Package rules is flannel's netfilter rules on a node: its iptables chains
// (FLANNEL-POSTRTG, FLANNEL-FWD) and nftables tables (flannel-ipv4,
// flannel-ipv6), for package takeover to stop and remove. It stands apart
// so that the CNI plugin, which needs takeover's names, links neither
// iptables nor nftables.
package rules

import (
	"errors"
	"fmt"
	"strings"

	"github.com/coreos/go-iptables/iptables"
	"github.com/google/nftables"

	"github.com/twill-net/twill/network"
	knft "github.com/twill-net/twill/nl/nft"
	"github.com/twill-net/twill/takeover"
)

// flannel's iptables chains, each with the built-in chain that jumps to
// it, and its nftables tables.
var (
	flannelJumps = []network.Jump{
		{Table: "nat", From: "POSTROUTING", To: "FLANNEL-POSTRTG"},
		{Table: "filter", From: "FORWARD", To: "FLANNEL-FWD"},
	}
	flannelTables = []struct {
		family nftables.TableFamily
		name   string
	}{{nftables.TableFamilyIPv4, "flannel-ipv4"}, {nftables.TableFamilyIPv6, "flannel-ipv6"}}
)

// System is flannel's rules in the caller's network namespace.
type System struct {
	// NFT is nftables (nil: the caller's namespace's).
	NFT knft.Kernel
}

func (n System) nft() knft.Kernel {
	if n.NFT == nil {
		return knft.Conn{}
	}
	return n.NFT
}

var _ takeover.Netfilter = System{}

// families opens iptables for each family that has a binary.
func families() []*iptables.IPTables {
	var out []*iptables.IPTables
	for _, p := range []iptables.Protocol{iptables.ProtocolIPv4, iptables.ProtocolIPv6} {
		if ipt, err := iptables.New(iptables.IPFamily(p), iptables.Timeout(5)); err == nil {
			out = append(out, ipt)
		}
	}
	return out
}

// Present reports whether a flannel chain or table exists.
func (n System) Present() (bool, error) {
	if ok, err := network.AnyChain(flannelJumps); ok || err != nil {
		return ok, err
	}
	tables, err := nftTables(n.nft())
	return len(tables) > 0, err
}

// Unhook deletes the rules of the built-in chains that jump to flannel's.
func (System) Unhook() error {
	var errs []error
	for _, ipt := range families() {
		for _, j := range flannelJumps {
			rules, err := ipt.List(j.Table, j.From)
			if err != nil {
				errs = append(errs, fmt.Errorf("listing %s/%s: %w", j.Table, j.From, err))
				continue
			}
			for _, r := range rules {
				spec, ok := jumpSpec(r, j.From, j.To)
				if !ok {
					continue
				}
				if err := ipt.DeleteIfExists(j.Table, j.From, spec...); err != nil {
					errs = append(errs, fmt.Errorf("deleting %s/%s rule %q: %w", j.Table, j.From, r, err))
				}
			}
		}
	}
	return errors.Join(errs...)
}

// Remove unhooks, then deletes flannel's chains and nftables tables.
func (n System) Remove() error {
	errs := []error{n.Unhook()}
	for _, ipt := range families() {
		for _, j := range flannelJumps {
			for _, table := range []string{"nat", "filter"} { // older flannels made FLANNEL-FWD in nat too
				ok, err := ipt.ChainExists(table, j.To)
				if err != nil || !ok {
					continue
				}
				if err := ipt.ClearAndDeleteChain(table, j.To); err != nil {
					errs = append(errs, fmt.Errorf("deleting chain %s/%s: %w", table, j.To, err))
				}
			}
		}
	}
	tables, err := nftTables(n.nft())
	if err != nil || len(tables) == 0 {
		return errors.Join(append(errs, err)...)
	}
	var b knft.Batch
	for _, t := range tables {
		b.DelTable(t)
	}
	if err := n.nft().Apply(&b); err != nil {
		errs = append(errs, fmt.Errorf("deleting flannel's nftables tables: %w", err))
	}
	return errors.Join(errs...)
}

// nftTables lists flannel's nftables tables.
func nftTables(k knft.Kernel) ([]*nftables.Table, error) {
	have, err := k.Tables()
	if err != nil {
		return nil, err
	}
	var out []*nftables.Table
	for _, t := range have {
		for _, f := range flannelTables {
			if t.Family == f.family && t.Name == f.name {
				out = append(out, t)
			}
		}
	}
	return out, nil
}

// jumpSpec turns a rule as iptables -S prints it ("-A FORWARD -m comment
// --comment "flanneld forward" -j FLANNEL-FWD") into the arguments that
// delete it, when it jumps from chain from to chain to.
func jumpSpec(rule, from, to string) ([]string, bool) {
	args := splitArgs(rule)
	if len(args) < 4 || args[0] != "-A" || args[1] != from || args[len(args)-2] != "-j" || args[len(args)-1] != to {
		return nil, false
	}
	return args[2:], true
}

// splitArgs splits an iptables -S line into arguments, keeping a quoted
// comment whole.
func splitArgs(s string) []string {
	var (
		out   []string
		cur   strings.Builder
		quote bool
		has   bool
	)
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '\\' && quote && i+1 < len(s):
			i++
			cur.WriteByte(s[i])
		case c == '"':
			quote, has = !quote, true
		case c == ' ' && !quote:
			if has {
				out = append(out, cur.String())
				cur.Reset()
				has = false
			}
		default:
			cur.WriteByte(c)
			has = true
		}
	}
	if has {
		out = append(out, cur.String())
	}
	return out
}
