package daemon

import (
	"context"
	"fmt"

	"github.com/twill-net/twill/network"
	"github.com/twill-net/twill/network/netfilter"
	"github.com/twill-net/twill/subnet"
)

// NodeNetwork is what a node needs besides its routes, set up before it is
// ready: IP forwarding, and the masquerade and forward rules of package
// netfilter.
type NodeNetwork interface {
	// SetUp turns forwarding on for the cluster's families, chooses the
	// netfilter mode and installs its rules for o.Networks, and returns
	// the mode and what keeps the rules in place until its context ends.
	SetUp(cfg *subnet.Config, o netfilter.Options) (netfilter.Mode, Runner, error)
}

// Runner runs until ctx is done.
type Runner interface {
	Run(ctx context.Context) error
}

// systemNode is the NodeNetwork of the network namespace twilld runs in.
type systemNode struct {
	mode netfilter.Mode // --netfilter (auto when empty)
}

func (n systemNode) SetUp(cfg *subnet.Config, o netfilter.Options) (netfilter.Mode, Runner, error) {
	if err := network.EnableForwarding(cfg.EnableIPv4, cfg.EnableIPv6); err != nil {
		return "", nil, err
	}
	choice, err := netfilter.Choose(n.mode, cfg.EnableNFTables, cfg.EnableIPv4, cfg.EnableIPv6, netfilter.NodeHost())
	if err != nil {
		return "", nil, fmt.Errorf("choosing the netfilter mode: %w", err)
	}
	o.Logger.Info("netfilter mode", "mode", choice.Mode, "why", choice.Why)
	rules := netfilter.NewRules(choice.Mode, o)
	if err := rules.Sync(); err != nil {
		return "", nil, fmt.Errorf("installing the %s rules: %w", choice.Mode, err)
	}
	// Only once this mode's rules are in place: a mode that cannot be
	// installed leaves the node's old rules where they were. Both sets
	// at once mean the same (a packet takes the first NAT).
	if err := netfilter.RemoveOthers(choice.Mode, o.Logger); err != nil {
		return "", nil, err
	}
	if choice.Mode == netfilter.NFTables {
		if drops, err := netfilter.ForwardDrop(); err == nil && len(drops) > 0 {
			o.Logger.Warn("forward chains of other tables drop by default; twill's accepts in its own nftables table cannot override them, so forwarded pod traffic may be dropped (use --netfilter=iptables, or accept the cluster Network in those chains)", "chains", drops)
		}
	}
	return choice.Mode, netfilter.NewKeeper(choice.Mode, rules, o), nil
}
