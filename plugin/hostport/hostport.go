package hostport

import (
	"bytes"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"

	"github.com/google/nftables"
	"golang.org/x/sys/unix"

	"github.com/twill-net/twill/nl/nft"
	"github.com/twill-net/twill/nl/nftsync"
)

// Add writes the pod's host ports in one transaction. A pod with no
// mapping that serves one of its addresses changes nothing. The owner has
// no rules yet: a failed ADD removes its own, DEL and GC remove the rest,
// and a second ADD of an attachment whose veth exists is refused before
// this (so Add need not read the pods' rules, which costs ~10 µs a rule).
//
// The base chains are written only when they are not as Add writes them
// (the first host port on the node): the kernel takes 10-20 ms to commit a
// change to a hooked chain, against well under 1 ms for a rule in a
// regular one. Flushed and written whole in the same transaction, they
// hold one copy of their rules however many ADDs race to write them.
func Add(k nft.Kernel, owner string, ips []netip.Addr, ports []Port) error {
	rs := podRules(owner, ips, ports)
	if len(rs) == 0 {
		return nil
	}
	ok, err := baseInPlace(k)
	if err != nil {
		return err
	}
	err = k.Apply(addBatch(rs, !ok))
	if err != nil && ok && errors.Is(err, unix.ENOENT) {
		// The table went between the read and the write (an operator
		// deleted it): write it whole.
		err = k.Apply(addBatch(rs, true))
	}
	if err != nil {
		return fmt.Errorf("host ports of %s: %w", owner, err)
	}
	return nil
}

// addBatch is Add's transaction: the table and base chains when base,
// and the pod's rules.
func addBatch(rs []*nftables.Rule, base bool) *nft.Batch {
	var b nft.Batch
	if base {
		b.AddTable(table)
		for _, c := range []*nftables.Chain{hostport, loopback, hairpin, pre, out, post} {
			b.AddChain(c)
		}
		for _, c := range []*nftables.Chain{pre, out, post} {
			b.FlushChain(c)
		}
		for _, r := range baseRules() {
			b.AddRule(r)
		}
	}
	for _, r := range rs {
		b.AddRule(r)
	}
	return &b
}

// baseInPlace says whether the base chains hold what Add writes, in order.
func baseInPlace(k nft.Kernel) (bool, error) {
	var have []*nftables.Rule
	for _, c := range []*nftables.Chain{pre, out, post} {
		rules, err := k.Rules(table, c.Name)
		if err != nil {
			return false, fmt.Errorf("reading the host ports: %w", err)
		}
		have = append(have, rules...)
	}
	ok, err := nftsync.KernelRulesAre(have, baseRules())
	if err != nil {
		return false, fmt.Errorf("comparing the host ports' base chains with what Add writes: %w", err)
	}
	return ok, nil
}

// Remove deletes owner's rules and says whether there were any. Rules
// another DEL or GC deleted between the read and the write are taken as
// deleted: the read and the write are tried once more.
func Remove(k nft.Kernel, owner string) (bool, error) {
	gone, err := deleteOwners(k, func(o string) bool { return o == owner })
	if err != nil {
		return len(gone) > 0, fmt.Errorf("deleting the host ports of %s: %w", owner, err)
	}
	return len(gone) > 0, nil
}

// Prune deletes the rules of every owner that stale names, in one
// transaction, and returns those owners, sorted.
func Prune(k nft.Kernel, stale func(owner string) bool) ([]string, error) {
	gone, err := deleteOwners(k, stale)
	if err != nil {
		return nil, fmt.Errorf("deleting the host ports of %s: %w", strings.Join(gone, ", "), err)
	}
	return gone, nil
}

// deleteOwners deletes the rules of the owners del names, in one
// transaction, and returns those owners, sorted. A rule that went between
// the read and the write (ENOENT) has the whole tried once more.
func deleteOwners(k nft.Kernel, del func(owner string) bool) ([]string, error) {
	var gone []string
	for try := 0; ; try++ {
		have, err := read(k)
		if err != nil {
			return nil, err
		}
		var b nft.Batch
		gone = nil
		for _, o := range slices.Sorted(maps.Keys(have)) {
			if del(o) {
				gone = append(gone, o)
				have.del(&b, o)
			}
		}
		if b.Len() == 0 {
			return nil, nil
		}
		err = k.Apply(&b)
		if err == nil || try > 0 || !errors.Is(err, unix.ENOENT) {
			return gone, err
		}
	}
}

// Owners lists the owners that have rules, sorted.
func Owners(k nft.Kernel) ([]string, error) {
	have, err := read(k)
	return slices.Sorted(maps.Keys(have)), err
}

// Check compares owner's rules with what Add writes for ips and ports,
// and names the first mapping that is missing or different.
func Check(k nft.Kernel, owner string, ips []netip.Addr, ports []Port) error {
	have, err := read(k)
	if err != nil {
		return err
	}
	got := map[string][]byte{}
	for _, r := range have[owner] {
		fp, err := nftsync.Fingerprint(r.Exprs)
		if err != nil {
			return err
		}
		got[comment(r)] = fp
	}
	for _, r := range podRules(owner, ips, ports) {
		fp, err := nftsync.Fingerprint(r.Exprs)
		if err != nil {
			return err
		}
		switch g, ok := got[comment(r)]; {
		case !ok:
			return fmt.Errorf("host port %s missing from table inet %s", describe(r), TableName)
		case !bytes.Equal(g, fp):
			return fmt.Errorf("host port %s in table inet %s is not what twill wrote", describe(r), TableName)
		}
	}
	return nil
}

// owned is the pods' rules in the kernel, by owner.
type owned map[string][]*nftables.Rule

// read reads the pods' rules: three requests, none when the table is not
// there.
func read(k nft.Kernel) (owned, error) {
	have := owned{}
	for _, c := range []*nftables.Chain{hostport, loopback, hairpin} {
		rules, err := k.Rules(table, c.Name)
		if err != nil {
			return nil, fmt.Errorf("reading the host ports: %w", err)
		}
		for _, r := range rules {
			if o := ownerOf(r); o != "" {
				if r.Handle == 0 {
					return nil, errors.New("reading the host ports: a rule without a handle")
				}
				have[o] = append(have[o], &nftables.Rule{Table: table, Chain: c, Handle: r.Handle, Exprs: r.Exprs, UserData: r.UserData})
			}
		}
	}
	return have, nil
}

// del queues the deletion of owner's rules.
func (have owned) del(b *nft.Batch, owner string) {
	for _, r := range have[owner] {
		b.DelRule(r)
	}
}

func comment(r *nftables.Rule) string { return nftsync.RuleComment(r) }

// ownerOf is the owner a pod's rule names first in its comment.
func ownerOf(r *nftables.Rule) string {
	o, _, _ := strings.Cut(comment(r), " ")
	return o
}

// describe is a pod rule's comment without its owner.
func describe(r *nftables.Rule) string {
	_, d, _ := strings.Cut(comment(r), " ")
	return d
}
