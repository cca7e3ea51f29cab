package lab

import (
	"context"
	"fmt"
	"net/netip"

	"github.com/twill-net/twill/lab/topology"
	"github.com/twill-net/twill/subnet/kube"
)

// routePodCIDRs routes each Node's pod subnet, in the underlay namespace
// where the control plane runs, to the node, as a cloud's route table does
// for a managed control plane: kube-apiserver reaches pods (its proxy, the
// e2e suite's result pages) the way it reaches nodes. Pod traffic between
// nodes never uses these routes: it stays on twill's.
func (s *State) routePodCIDRs(ctx context.Context) error {
	nodes, err := s.kubeNodes(ctx)
	if err != nil {
		return err
	}
	for _, kn := range nodes {
		if len(kn.Spec.PodCIDRs) < len(s.kubeNet().PodCIDRs) {
			return fmt.Errorf("Node %s has podCIDRs %v, want one per family of %v", kn.Name, kn.Spec.PodCIDRs, s.kubeNet().PodCIDRs)
		}
		for _, n := range s.Nodes {
			if n.Name != kn.Name {
				continue
			}
			v4, v6, err := kube.PodCIDRs(&kn)
			if err != nil {
				return err
			}
			for _, p := range []netip.Prefix{v4, v6} {
				if !p.IsValid() {
					continue
				}
				via := n.addrFor(p.Addr())
				if !via.IsValid() {
					return fmt.Errorf("Node %s: podCIDR %s: the lab's node has no address of its family", kn.Name, p)
				}
				if err := topology.IP(s.underlayNS(), "route", "replace", p.String(), "via", via.String()); err != nil {
					return fmt.Errorf("routing %s's pod subnet %s from the control plane: %w", n.Name, p, err)
				}
			}
		}
	}
	return nil
}
