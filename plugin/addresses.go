package plugin

import (
	"context"
	"fmt"
	"net/netip"

	"github.com/containernetworking/cni/pkg/skel"
	current "github.com/containernetworking/cni/pkg/types/100"

	"github.com/twill-net/twill/subnet"
)

// addAddresses allocates the pod's addresses in process, or through the
// configured IPAM plugin.
func addAddresses(c *NetConf, args *skel.CmdArgs, env subnet.Env, linkExists func(string) (bool, error)) ([]netip.Addr, *current.Result, error) {
	if c.IPAM.Type != "" {
		r, err := delegateAdd(context.Background(), c.IPAM.Type, args.StdinData)
		if err != nil {
			return nil, nil, fmt.Errorf("twill: delegated IPAM %q: %w", c.IPAM.Type, err)
		}
		res, err := current.NewResultFromResult(r)
		if err != nil {
			_, _ = delegate(context.Background(), "DEL", c.IPAM.Type, args.StdinData)
			return nil, nil, fmt.Errorf("twill: delegated IPAM %q result: %w", c.IPAM.Type, err)
		}
		var ips []netip.Addr
		for _, ipc := range res.IPs {
			a, _ := netip.AddrFromSlice(ipc.Address.IP)
			ips = append(ips, a.Unmap())
		}
		if len(ips) == 0 {
			_, _ = delegate(context.Background(), "DEL", c.IPAM.Type, args.StdinData)
			return nil, nil, fmt.Errorf("twill: delegated IPAM %q returned no address", c.IPAM.Type)
		}
		return ips, res, nil
	}
	var subnets []netip.Prefix
	if env.Subnet.IsValid() {
		subnets = append(subnets, env.Subnet)
	}
	if env.IPv6Subnet.IsValid() {
		subnets = append(subnets, env.IPv6Subnet)
	}
	ips, err := allocate(c, args.ContainerID, args.IfName, linkExists, subnets...)
	return ips, nil, err
}

// delAddresses releases the attachment's addresses: through the configured
// IPAM plugin, or in process, the files found (podReservations) or, with
// none found, whatever the store holds for the attachment.
func delAddresses(c *NetConf, args *skel.CmdArgs, found []reservation) error {
	if c.IPAM.Type != "" {
		if _, err := delegate(context.Background(), "DEL", c.IPAM.Type, args.StdinData); err != nil {
			return fmt.Errorf("twill: delegated IPAM %q: %w", c.IPAM.Type, err)
		}
		return nil
	}
	if found != nil {
		return releaseFiles(c, args.ContainerID, args.IfName, found)
	}
	return release(c, args.ContainerID, args.IfName)
}
