package plugin

import (
	"fmt"
	"net"
	"net/netip"
	"path/filepath"
	"strings"
	"time"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/plugins/pkg/ipam"
	"github.com/containernetworking/plugins/plugins/ipam/host-local/backend/allocator"
	"github.com/containernetworking/plugins/plugins/ipam/host-local/backend/disk"
	"github.com/twill-net/twill/internal/allocations"
	"github.com/twill-net/twill/subnet"
)

// store opens host-local's on-disk store for the network: one file per
// address under <dataDir>/<network>, holding "<container>\r\n<ifname>".
func store(c *NetConf) (*disk.Store, error) {
	s, err := disk.New(c.Name, c.DataDir)
	if err != nil {
		return nil, fmt.Errorf("twill: opening allocation store %s: %w", filepath.Join(c.DataDir, c.Name), err)
	}
	return s, nil
}

func rangeSet(subnet netip.Prefix) (*allocator.RangeSet, error) {
	r := allocator.Range{Subnet: types.IPNet{IP: subnet.Addr().AsSlice(), Mask: net.CIDRMask(subnet.Bits(), subnet.Addr().BitLen())}}
	if err := r.Canonicalize(); err != nil {
		return nil, fmt.Errorf("twill: subnet %s: %w", subnet, err)
	}
	rs := allocator.RangeSet{r}
	return &rs, nil
}

// allocate reserves one address in each subnet for the attachment. On
// failure nothing stays reserved. When a subnet is full it first reclaims
// the allocations whose pods are gone (their host veth no longer exists):
// a runtime that never calls GC leaves them behind on every lost DEL.
func allocate(c *NetConf, containerID, ifName string, linkExists func(string) (bool, error), subnets ...netip.Prefix) (_ []netip.Addr, err error) {
	s, err := store(c)
	if err != nil {
		return nil, err
	}
	defer s.Close()
	if err := s.Lock(); err != nil {
		return nil, fmt.Errorf("twill: locking allocation store: %w", err)
	}
	defer s.Unlock()
	var out []netip.Addr
	defer func() {
		if err != nil && len(out) > 0 {
			_ = s.ReleaseByID(containerID, ifName)
		}
	}()
	for i, subnet := range subnets {
		rs, err := rangeSet(subnet)
		if err != nil {
			return nil, err
		}
		ipc, err := allocator.NewIPAllocator(rs, s, i).Get(containerID, ifName, nil)
		if err != nil && strings.Contains(err.Error(), "no IP addresses available") {
			gone, rerr := allocations.Reclaim(filepath.Join(c.DataDir, c.Name), allocations.Grace, time.Now(), linkExists)
			if len(gone) > 0 {
				ipc, err = allocator.NewIPAllocator(rs, s, i).Get(containerID, ifName, nil)
			} else if rerr != nil {
				err = fmt.Errorf("%w (and reclaiming addresses of pods that are gone: %v)", err, rerr)
			}
		}
		if err != nil {
			return nil, fmt.Errorf("twill: allocating an address in %s: %w", subnet, err)
		}
		a, _ := netip.AddrFromSlice(ipc.Address.IP)
		out = append(out, a.Unmap())
	}
	return out, nil
}

// release frees the attachment's addresses; none reserved is fine.
func release(c *NetConf, containerID, ifName string) error {
	s, err := store(c)
	if err != nil {
		return err
	}
	defer s.Close()
	if err := s.Lock(); err != nil {
		return fmt.Errorf("twill: locking allocation store: %w", err)
	}
	defer s.Unlock()
	if err := s.ReleaseByID(containerID, ifName); err != nil {
		return fmt.Errorf("twill: releasing addresses of %s/%s: %w", containerID, ifName, err)
	}
	return nil
}

// reservation is one allocation file.
type reservation = allocations.Record

// reservations lists the allocation files of the network (the caller holds
// the store lock when it matters).
func reservations(c *NetConf) ([]reservation, error) {
	return allocations.Records(filepath.Join(c.DataDir, c.Name))
}

// addAddresses allocates the pod's addresses in process, or through the
// configured IPAM plugin.
func addAddresses(c *NetConf, args *skel.CmdArgs, env subnet.Env, linkExists func(string) (bool, error)) ([]netip.Addr, *current.Result, error) {
	if c.IPAM.Type != "" {
		r, err := ipam.ExecAdd(c.IPAM.Type, args.StdinData)
		if err != nil {
			return nil, nil, fmt.Errorf("twill: delegated IPAM %q: %w", c.IPAM.Type, err)
		}
		res, err := current.NewResultFromResult(r)
		if err != nil {
			_ = ipam.ExecDel(c.IPAM.Type, args.StdinData)
			return nil, nil, fmt.Errorf("twill: delegated IPAM %q result: %w", c.IPAM.Type, err)
		}
		var ips []netip.Addr
		for _, ipc := range res.IPs {
			a, _ := netip.AddrFromSlice(ipc.Address.IP)
			ips = append(ips, a.Unmap())
		}
		if len(ips) == 0 {
			_ = ipam.ExecDel(c.IPAM.Type, args.StdinData)
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

func delAddresses(c *NetConf, args *skel.CmdArgs) error {
	if c.IPAM.Type != "" {
		if err := ipam.ExecDel(c.IPAM.Type, args.StdinData); err != nil {
			return fmt.Errorf("twill: delegated IPAM %q: %w", c.IPAM.Type, err)
		}
		return nil
	}
	return release(c, args.ContainerID, args.IfName)
}
