package plugin

import (
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"path/filepath"
	"slices"

	"github.com/containernetworking/cni/pkg/skel"

	eni "github.com/twill-net/twill/backend/eni/cni"
	"github.com/twill-net/twill/nl"
	"github.com/twill-net/twill/plugin/allocations"
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
	prev := prevIPs(c)
	ips := slices.Clone(prev)
	others := map[netip.Addr]bool{}
	note := func(mine []reservation, held map[netip.Addr]bool) {
		for _, rv := range mine {
			ips = append(ips, rv.IP)
		}
		maps.Copy(others, held)
	}
	mine, held := podReservations(filepath.Join(c.DataDir, c.Name), args.ContainerID, args.IfName, prev)
	note(mine, held)
	var poolDir string
	if env, err := subnet.ReadEnv(c.SubnetFile); err == nil {
		if em, isENI, _ := eniFromEnv(env); isENI && em.PoolDir != "" {
			poolDir = em.PoolDir
			note(podReservations(filepath.Join(poolDir, eni.PoolStoreName), args.ContainerID, args.IfName, prev))
		}
	}
	ips = slices.DeleteFunc(ips, func(ip netip.Addr) bool { return others[ip] })
	if err := deletePodRules(host, ips); err != nil {
		errs = append(errs, err)
	}
	if err := delHostPorts(args, c); err != nil {
		errs = append(errs, err)
	}
	if err := delAntiSpoof(HostVethName(args.ContainerID, args.IfName)); err != nil {
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
	if err := delAddresses(c, args, mine); err != nil {
		errs = append(errs, err)
	}
	if len(mine) == 0 && c.IPAM.Type == "" {
		// Not an attachment of this network's store: perhaps one flannel
		// wired, before this node switched.
		if err := releaseElsewhere(c, args.ContainerID, args.IfName); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// podReservations finds the attachment's allocation files in a store
// directory, and which of the addresses prevResult names another
// attachment holds now (a repeated DEL, after the address was reused).
// With prevResult's addresses it reads their files alone; without them,
// or when none is the attachment's, it reads the whole store.
func podReservations(dir, containerID, ifName string, prev []netip.Addr) (mine []reservation, others map[netip.Addr]bool) {
	others = map[netip.Addr]bool{}
	sort := func(rv reservation) {
		if rv.ContainerID == containerID && rv.IfName == ifName {
			mine = append(mine, rv)
		} else {
			others[rv.IP] = true
		}
	}
	for _, ip := range prev {
		if rv, ok, err := allocations.Read(dir, ip); err == nil && ok {
			sort(rv)
		}
	}
	if len(mine) > 0 {
		return mine, others
	}
	all, _ := allocations.Records(dir)
	for _, rv := range all {
		sort(rv)
	}
	return mine, others
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
