package plugin

import (
	"errors"
	"fmt"
	"net/netip"
	"os"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"

	"github.com/twill-net/twill/nl"
	"github.com/twill-net/twill/subnet"
)

// cmdGC removes allocations, host veths and host ports of attachments the
// runtime no longer has (cni.dev/valid-attachments).
func cmdGC(args *skel.CmdArgs, c *NetConf) error {
	valid := map[types.GCAttachment]bool{}
	for _, a := range c.ValidAttachments {
		valid[a] = true
	}
	stale, unlock, listErr, err := staleAllocations(c, valid)
	if err != nil {
		return err
	}
	errs := []error{listErr} // a record that cannot be read leaves the rest to collect
	defer unlock()           // until the stale records are gone
	host, err := nl.Open("")
	if err != nil {
		return fmt.Errorf("twill: %w", err)
	}
	defer host.Close()
	if env, err := subnet.ReadEnv(c.SubnetFile); err == nil {
		if em, isENI, _ := eniFromEnv(env); isENI && em.PoolDir != "" {
			poolStale, err := poolStale(em.PoolDir, valid)
			errs = append(errs, err)
			stale = append(stale, poolStale...)
		}
	}
	errs = append(errs, releaseStale(host, stale))
	// Veths labelled with an attachment the runtime no longer has.
	links, err := host.Links()
	if err != nil {
		return errors.Join(append(errs, fmt.Errorf("twill: %w", err))...)
	}
	for _, l := range links {
		att, ok := ParseLinkAlias(c.Name, l.Alias)
		if !ok || valid[att] {
			continue
		}
		if err := host.LinkDel(l.Index); err != nil {
			errs = append(errs, fmt.Errorf("twill: %w", err))
		}
	}
	errs = append(errs, pruneHostPorts(host), pruneAntiSpoof(host))
	return errors.Join(errs...)
}

// staleAllocations lists the in-process allocations of attachments not in
// valid, holding the store's lock until unlock is called. listErr is about
// records it could not read; the others are listed all the same.
func staleAllocations(c *NetConf, valid map[types.GCAttachment]bool) (stale []reservation, unlock func(), listErr, err error) {
	if c.IPAM.Type != "" {
		return nil, func() {}, nil, nil // the delegated IPAM keeps its own
	}
	s, err := store(c)
	if err != nil {
		return nil, nil, nil, err
	}
	if err := s.Lock(); err != nil {
		s.Close()
		return nil, nil, nil, fmt.Errorf("twill: locking allocation store: %w", err)
	}
	res, listErr := reservations(c)
	for _, rv := range res {
		if !valid[types.GCAttachment{ContainerID: rv.ContainerID, IfName: rv.IfName}] {
			stale = append(stale, rv)
		}
	}
	return stale, func() { s.Unlock(); s.Close() }, listErr, nil
}

// releaseStale removes the rules, veths and records of stale allocations.
// An allocation is recorded before its veth exists, and the veth's name
// follows from the record: this finds the veth of an ADD killed before it
// could label the link with its alias.
func releaseStale(host *nl.Handle, stale []reservation) error {
	var errs []error
	var ips []netip.Addr
	for _, rv := range stale {
		ips = append(ips, rv.IP)
	}
	errs = append(errs, deletePodRules(host, ips))
	for _, rv := range stale {
		if l, err := host.LinkByName(HostVethName(rv.ContainerID, rv.IfName)); err == nil {
			if err := host.LinkDel(l.Index); err != nil {
				errs = append(errs, fmt.Errorf("twill: %w", err))
			}
		}
		if err := os.Remove(rv.Path); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, fmt.Errorf("twill: releasing %s: %w", rv.IP, err))
		}
	}
	return errors.Join(errs...)
}
