// Package netfilter chooses how twill writes its masquerade and forward
// rules (iptables chains through the iptables binaries, or its own
// nftables table over netlink), builds what keeps them in place, and
// removes the other mode's rules.
package netfilter

import (
	"fmt"
	"strings"
)

// Mode is how the rules are written.
type Mode string

const (
	Auto     Mode = "auto"     // choose at start: see Choose
	IPTables Mode = "iptables" // chains TWILL-POSTRTG and TWILL-FWD, through iptables/ip6tables
	NFTables Mode = "nftables" // table inet twill, over netlink
)

// ParseMode parses the --netfilter value.
func ParseMode(s string) (Mode, error) {
	switch m := Mode(strings.ToLower(strings.TrimSpace(s))); m {
	case Auto, IPTables, NFTables:
		return m, nil
	}
	return "", fmt.Errorf("--netfilter %q: want auto, iptables or nftables", s)
}

// Host is what the auto mode looks at on the node.
type Host struct {
	// IPTables says whether the family's iptables binary exists, and
	// whether it is iptables-nft.
	IPTables func(v6 bool) (present, nft bool)
	// TwillChains says whether twill's iptables chains exist (an earlier
	// run used the iptables mode).
	TwillChains func() (bool, error)
	// ForwardDrop lists the base chains of other tables at the forward
	// hook whose policy is drop (an accept in twill's table cannot
	// override them).
	ForwardDrop func() ([]string, error)
}

// Choice is the mode chosen and why, for the log.
type Choice struct {
	Mode Mode
	Why  string
}

// Choose picks the mode. An explicit --netfilter wins; then net-conf.json's
// EnableNFTables (flannel's field), when set; then auto: nftables when the
// node has no iptables, or when its iptables is iptables-nft, no twill
// iptables chains exist and no other table's forward chain drops by
// default; iptables otherwise.
func Choose(flag Mode, enableNFTables *bool, v4, v6 bool, h Host) (Choice, error) {
	if flag == IPTables || flag == NFTables {
		why := "--netfilter=" + string(flag)
		if enableNFTables != nil && *enableNFTables != (flag == NFTables) {
			why += fmt.Sprintf(" (it overrides net-conf.json EnableNFTables: %v)", *enableNFTables)
		}
		return Choice{flag, why}, nil
	}
	if enableNFTables != nil {
		if *enableNFTables {
			return Choice{NFTables, "net-conf.json EnableNFTables: true"}, nil
		}
		return Choice{IPTables, "net-conf.json EnableNFTables: false"}, nil
	}
	var fams []bool
	if v4 {
		fams = append(fams, false)
	}
	if v6 {
		fams = append(fams, true)
	}
	anyIPT := false
	for _, fam := range fams {
		present, nft := h.IPTables(fam)
		anyIPT = anyIPT || present
		if present && !nft {
			return Choice{IPTables, "auto: the node's " + binary(fam) + " is iptables-legacy; nftables rules beside legacy ones would not see what they drop"}, nil
		}
	}
	if !anyIPT {
		return Choice{NFTables, "auto: the node has no iptables binary"}, nil
	}
	has, err := h.TwillChains()
	if err != nil {
		return Choice{}, err
	}
	if has {
		return Choice{IPTables, "auto: twill's iptables chains exist from an earlier run (--netfilter=nftables moves them to nftables)"}, nil
	}
	drops, err := h.ForwardDrop()
	if err != nil {
		return Choice{}, err
	}
	if len(drops) > 0 {
		return Choice{IPTables, "auto: forward chains of other tables drop by default (" + strings.Join(drops, ", ") + "); only a rule inside them can accept pod traffic"}, nil
	}
	return Choice{NFTables, "auto: the node's iptables is iptables-nft, no twill iptables chains exist and no forward chain drops by default"}, nil
}

func binary(v6 bool) string {
	if v6 {
		return "ip6tables"
	}
	return "iptables"
}
