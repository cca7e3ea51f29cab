package daemon

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"

	"github.com/twill-net/twill/backend/nl"
	"github.com/twill-net/twill/backend/owned"
	"github.com/twill-net/twill/network"
)

// Cleanup removes everything twill programmed in the handle's namespace:
// routes with twill's protocol in any table, twill's devices, its iptables
// chains, and subnet.env. It finds them by the identities in package owned,
// so it needs neither the configuration nor etcd.
func Cleanup(log *slog.Logger, h *nl.Handle, subnetFile string) error {
	var errs []error
	routes, err := h.Routes(nl.FamilyAll, nl.RouteFilter{AllTables: true, Protocol: owned.RouteProtocol})
	if err != nil {
		errs = append(errs, err)
	}
	for _, r := range routes {
		if err := h.RouteDel(r); err != nil {
			errs = append(errs, err)
		}
	}
	rules, restored, err := cleanupRules(h)
	if err != nil {
		errs = append(errs, err)
	}
	links, err := h.Links()
	if err != nil {
		errs = append(errs, err)
	}
	var removed []string
	for _, l := range links {
		if strings.HasPrefix(l.Name, owned.VXLANDevicePrefix) {
			if err := h.LinkDel(l.Index); err != nil {
				errs = append(errs, err)
				continue
			}
			removed = append(removed, l.Name)
		}
	}
	if err := network.CleanupChains(); err != nil {
		errs = append(errs, err)
	}
	if err := os.Remove(subnetFile); err != nil && !errors.Is(err, os.ErrNotExist) {
		errs = append(errs, fmt.Errorf("removing %s: %w", subnetFile, err))
	}
	log.Info("cleaned up", "routes", len(routes), "rules", rules, "restored", restored, "devices", removed, "subnet_file", subnetFile)
	return errors.Join(errs...)
}

// cleanupRules deletes the policy rules twilld made (protocol 167). A rule
// from an address of this node is the eni backend's rule for its ENI; the
// backend also took that address's subnet route out of main, so it is put
// back, as the kernel had it.
func cleanupRules(h *nl.Handle) (deleted int, restored []string, err error) {
	rules, err := h.Rules(nl.FamilyAll)
	if err != nil {
		return 0, nil, err
	}
	var errs []error
	for _, r := range rules {
		if r.Protocol != owned.RouteProtocol {
			continue
		}
		if err := h.RuleDel(r); err != nil {
			errs = append(errs, err)
			continue
		}
		deleted++
		if !r.Src.IsValid() || !r.Src.IsSingleIP() {
			continue
		}
		links, err := h.Links()
		if err != nil {
			errs = append(errs, err)
			continue
		}
		for _, l := range links {
			addrs, err := h.Addrs(l.Index, nl.FamilyAll)
			if err != nil {
				continue
			}
			for _, a := range addrs {
				if a.Prefix.Addr() != r.Src.Addr() || a.Prefix.IsSingleIP() {
					continue
				}
				rt := nl.Route{Dst: a.Prefix.Masked(), LinkIndex: l.Index, Scope: nl.ScopeLink, Src: a.Prefix.Addr(), Protocol: kernelProtocol}
				if err := h.RouteAdd(rt); err == nil {
					restored = append(restored, rt.Dst.String()+" dev "+l.Name)
				}
			}
		}
	}
	return deleted, restored, errors.Join(errs...)
}

// kernelProtocol is RTPROT_KERNEL: routes the kernel adds for an address.
const kernelProtocol = 2
