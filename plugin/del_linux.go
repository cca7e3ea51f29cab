package plugin

import (
	"errors"
	"fmt"
	"net/netip"
	"path/filepath"
	"slices"

	"github.com/containernetworking/cni/pkg/skel"

	eni "github.com/twill-net/twill/backend/eni/cni"
	"github.com/twill-net/twill/internal/allocations"
	"github.com/twill-net/twill/nl"
	"github.com/twill-net/twill/subnet"
)

// cmdDel removes the attachment. Everything missing counts as removed, and
// nothing here needs subnet.env or the pod's namespace, so DEL works with
// the daemon down and the pod gone.
func cmdDel(args *skel.CmdArgs, c *NetConf) error {
	var errs []error
	host, err := nl.Open("")
	if err != nil {
		return fmt.Errorf("twill: %w", err)
	}
	defer host.Close()
	// The pod's addresses, for its policy rules (eni): from prevResult,
	// the allocation records and the warm pool, so that DEL finds them with
	// the daemon down and the pod gone.
	// An address another attachment holds now (a repeated DEL, after the
	// address was reused) keeps its rules: they are that pod's.
	ips := prevIPs(c)
	others := map[netip.Addr]bool{}
	note := func(res []reservation) {
		for _, rv := range res {
			if rv.ContainerID == args.ContainerID && rv.IfName == args.IfName {
				ips = append(ips, rv.IP)
			} else {
				others[rv.IP] = true
			}
		}
	}
	if res, err := reservations(c); err == nil {
		note(res)
	}
	var poolDir string
	if env, err := subnet.ReadEnv(c.SubnetFile); err == nil {
		if em, isENI, _ := eniFromEnv(env); isENI && em.PoolDir != "" {
			poolDir = em.PoolDir
			if res, err := allocations.Records(filepath.Join(poolDir, eni.PoolStoreName)); err == nil {
				note(res)
			}
		}
	}
	ips = slices.DeleteFunc(ips, func(ip netip.Addr) bool { return others[ip] })
	if err := deletePodRules(host, ips); err != nil {
		errs = append(errs, err)
	}
	if poolDir != "" {
		if _, err := poolRelease(poolDir, args.ContainerID, args.IfName); err != nil {
			errs = append(errs, err)
		}
	}
	// Deleting the host end deletes the pod end and both /32 routes.
	if l, err := host.LinkByName(HostVethName(args.ContainerID, args.IfName)); err == nil {
		if err := host.LinkDel(l.Index); err != nil {
			errs = append(errs, fmt.Errorf("twill: %w", err))
		}
	} else if !errors.Is(err, nl.ErrLinkNotFound) {
		errs = append(errs, fmt.Errorf("twill: %w", err))
	} else if err := delPodEnd(args); err != nil {
		errs = append(errs, err)
	}
	if err := delAddresses(c, args); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// delPodEnd deletes the pod's interface from inside its namespace, when
// twill's host end was not there: a pod that another plugin wired on the
// same network (flannel's bridge, on a node switched from flannel) leaves
// its bridge port with it, as that plugin's DEL would. A namespace or an
// interface already gone is fine.
func delPodEnd(args *skel.CmdArgs) error {
	if args.Netns == "" {
		return nil
	}
	pod, err := nl.OpenPath(args.Netns)
	if err != nil {
		return nil // the pod's namespace is gone, and its interface with it
	}
	defer pod.Close()
	l, err := pod.LinkByName(args.IfName)
	if errors.Is(err, nl.ErrLinkNotFound) {
		return nil
	}
	if err == nil {
		err = pod.LinkDel(l.Index)
	}
	if err != nil {
		return fmt.Errorf("twill: deleting %s in %s: %w", args.IfName, args.Netns, err)
	}
	return nil
}
