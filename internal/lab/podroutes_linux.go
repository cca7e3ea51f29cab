package lab

import (
	"context"
	"fmt"

	"github.com/twill-net/twill/internal/topology"
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
		if kn.Spec.PodCIDR == "" {
			return fmt.Errorf("Node %s has no podCIDR yet", kn.Name)
		}
		for _, n := range s.Nodes {
			if n.Name != kn.Name {
				continue
			}
			if err := topology.IP(s.underlayNS(), "route", "replace", kn.Spec.PodCIDR, "via", n.Addr.String()); err != nil {
				return fmt.Errorf("routing %s's pod subnet %s from the control plane: %w", n.Name, kn.Spec.PodCIDR, err)
			}
		}
	}
	return nil
}
