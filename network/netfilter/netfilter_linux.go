package netfilter

import (
	"errors"
	"fmt"
	"log/slog"
	"os/exec"
	"time"

	"github.com/google/nftables"

	"github.com/twill-net/twill/network"
	nft "github.com/twill-net/twill/network/nftables"
	"github.com/twill-net/twill/nl"
	knft "github.com/twill-net/twill/nl/nft"
)

// NodeHost is the Host of the node twilld runs on (its network namespace).
func NodeHost() Host {
	return Host{
		IPTables: func(v6 bool) (bool, bool) {
			if _, err := exec.LookPath(binary(v6)); err != nil {
				return false, false
			}
			return true, network.UsesNFTables(v6)
		},
		TwillChains: network.HasChains,
		ForwardDrop: ForwardDrop,
	}
}

// ForwardDrop lists the forward base chains outside twill's table whose
// policy is drop (iptables-nft's filter FORWARD among them).
func ForwardDrop() ([]string, error) {
	chains, err := knft.Conn{}.Chains()
	if err != nil {
		return nil, err
	}
	var drops []string
	for _, c := range chains {
		fam := c.Table.Family
		if fam != nftables.TableFamilyIPv4 && fam != nftables.TableFamilyIPv6 && fam != nftables.TableFamilyINet {
			continue
		}
		if c.Hooknum == nil || *c.Hooknum != *nftables.ChainHookForward || c.Policy == nil || *c.Policy != nftables.ChainPolicyDrop {
			continue
		}
		if fam == nftables.TableFamilyINet && c.Table.Name == nft.TableName {
			continue
		}
		drops = append(drops, fmt.Sprintf("%s %s %s", knft.FamilyName(fam), c.Table.Name, c.Name))
	}
	return drops, nil
}

// Options describe the rules wanted.
type Options struct {
	Logger   *slog.Logger
	Networks []network.NetworkPair
	IPMasq   bool
	// Repaired is called for each repair of rules changed behind twill's
	// back (the daemon counts them in twill_drift_repairs_total).
	Repaired func()
	// Resync is the iptables-legacy poll period (the check's period while
	// no change notifications arrive).
	Resync time.Duration
	// WatchedResync is the safety net's period while changes are
	// announced (5 min when zero); it checks only when nftables'
	// generation moved.
	WatchedResync time.Duration
}

// Rules are one mode's rules: Sync writes them, Drift compares them.
type Rules interface {
	network.Syncer
	Drift() (network.RuleDrift, error)
}

// NewRules builds the mode's rules.
func NewRules(m Mode, o Options) Rules {
	if m == NFTables {
		return &nft.Table{Logger: o.Logger, Networks: o.Networks, IPMasq: o.IPMasq, Repaired: o.Repaired}
	}
	return &network.Chains{Logger: o.Logger, Networks: o.Networks, IPMasq: o.IPMasq, Repaired: o.Repaired}
}

// NewKeeper builds what keeps the mode's rules in place: checks on every
// nftables change where changes are announced (the nftables mode, and
// iptables-nft), and a poll every o.Resync otherwise.
func NewKeeper(m Mode, rules Rules, o Options) *network.Keeper {
	k := &network.Keeper{Logger: o.Logger, Rules: rules, Resync: o.Resync, WatchedResync: o.WatchedResync}
	announced := true
	if m == IPTables {
		for _, np := range o.Networks {
			announced = announced && network.UsesNFTables(np.Cluster.Addr().Is6())
		}
	}
	if announced {
		k.Watch = nl.WatchNftables
		k.Generation = nl.NftGeneration
	}
	return k
}

// RemoveOthers removes the twill rules of the mode not in use, so that a
// switch leaves no stale rules behind, and logs what it removed.
func RemoveOthers(m Mode, log *slog.Logger) error {
	if m == IPTables {
		removed, err := nft.Delete(nil)
		if removed {
			log.Info("removed twill's nftables table: the iptables mode is in use", "table", "inet "+nft.TableName)
		}
		return err
	}
	has, err := network.HasChains()
	if err != nil || !has {
		return err
	}
	if err := network.CleanupChains(); err != nil {
		return fmt.Errorf("removing twill's iptables chains: %w", err)
	}
	log.Info("removed twill's iptables chains: the nftables mode is in use")
	return nil
}

// Cleanup removes twill's rules of both modes (a node without iptables
// has none of that mode's).
func Cleanup() error {
	var errs []error
	if _, err := exec.LookPath("iptables"); err == nil {
		errs = append(errs, network.CleanupChains())
	}
	if _, err := nft.Delete(nil); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}
