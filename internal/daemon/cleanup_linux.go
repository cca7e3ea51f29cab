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
	log.Info("cleaned up", "routes", len(routes), "devices", removed, "subnet_file", subnetFile)
	return errors.Join(errs...)
}
