package plugin

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/containernetworking/plugins/plugins/ipam/host-local/backend/disk"

	"github.com/twill-net/twill/plugin/allocations"
	"github.com/twill-net/twill/takeover"
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

// errNoAddress is returned when every address of a subnet is taken.
var errNoAddress = errors.New("no IP addresses available")

// maxProbes bounds the addresses one allocation tries: more than an IPv4
// /16 holds, far fewer than an IPv6 /64 (whose store never fills).
const maxProbes = 1 << 17

// hostRange is the span host-local hands out in subnet: from the address
// after the first (the first is the gateway, which it skips) to the last,
// an IPv4 subnet's broadcast address excluded.
func hostRange(subnet netip.Prefix) (first, last netip.Addr, err error) {
	p := subnet.Masked()
	bits := p.Addr().BitLen()
	if p.Bits() > bits-2 {
		return first, last, fmt.Errorf("subnet %s is too small to allocate from", subnet)
	}
	b := p.Addr().As16()
	for i := range bits - p.Bits() {
		b[15-i/8] |= 1 << (i % 8)
	}
	last = netip.AddrFrom16(b)
	if p.Addr().Is4() {
		last = last.Unmap().Prev()
	}
	return p.Addr().Next().Next(), last, nil
}

// reserveNext reserves the first free address of subnet after the one
// reserved last (host-local's order and on-disk record, rangeID being the
// subnet's index, so that stores written by either stay usable by both).
// The caller holds the store's lock. Unlike host-local it does not read
// every allocation to refuse a second one for the attachment (a cost that
// grew with the pods on the node); ADD refuses an attachment whose host
// interface exists before it allocates.
func reserveNext(s *disk.Store, containerID, ifName string, subnet netip.Prefix, rangeID int, heldElsewhere map[netip.Addr]bool) (netip.Addr, error) {
	first, last, err := hostRange(subnet)
	if err != nil {
		return netip.Addr{}, err
	}
	inRange := func(a netip.Addr) bool { return a.IsValid() && first.Compare(a) <= 0 && a.Compare(last) <= 0 }
	next := func(a netip.Addr) netip.Addr {
		if a == last {
			return first
		}
		return a.Next()
	}
	id := strconv.Itoa(rangeID)
	start := first
	if ip, err := s.LastReservedIP(id); err == nil {
		if a, ok := netip.AddrFromSlice(ip); ok && inRange(a.Unmap()) {
			start = next(a.Unmap())
		}
	}
	a := start
	for range maxProbes {
		if heldElsewhere[a] {
			if a = next(a); a == start {
				break
			}
			continue
		}
		ok, err := s.Reserve(containerID, ifName, a.AsSlice(), id)
		if err != nil {
			return netip.Addr{}, err
		}
		if ok {
			return a, nil
		}
		if a = next(a); a == start {
			break
		}
	}
	return netip.Addr{}, fmt.Errorf("%w in %s", errNoAddress, subnet.Masked())
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
	// Addresses another network's store holds (flannel's, on a node
	// switched from flannel, whatever this conflist is named) are not
	// handed out: their pods are still running.
	held, err := allocations.HeldElsewhere(c.DataDir, c.Name, subnets...)
	if err != nil {
		return nil, fmt.Errorf("twill: %w", err)
	}
	for i, subnet := range subnets {
		a, err := reserveNext(s, containerID, ifName, subnet, i, held)
		if errors.Is(err, errNoAddress) && !flannelBridge(linkExists) {
			gone, rerr := allocations.Reclaim(filepath.Join(c.DataDir, c.Name), allocations.Grace, time.Now(), linkExists)
			if len(gone) > 0 {
				a, err = reserveNext(s, containerID, ifName, subnet, i, held)
			} else if rerr != nil {
				err = fmt.Errorf("%w (and reclaiming addresses of pods that are gone: %v)", err, rerr)
			}
		}
		if err != nil {
			return nil, fmt.Errorf("twill: allocating an address in %s: %w", subnet, err)
		}
		out = append(out, a)
	}
	return out, nil
}

// release frees the attachment's addresses; none reserved is fine.
func release(c *NetConf, containerID, ifName string) error {
	return withStore(c, func(s *disk.Store) error {
		if err := s.ReleaseByID(containerID, ifName); err != nil {
			return fmt.Errorf("twill: releasing addresses of %s/%s: %w", containerID, ifName, err)
		}
		return nil
	})
}

// releaseFiles releases the allocation files found for an attachment
// (podReservations), each only if it is still the attachment's: DEL reads
// the addresses' files rather than the whole store, as ReleaseByID does.
func releaseFiles(c *NetConf, containerID, ifName string, found []reservation) error {
	return withStore(c, func(*disk.Store) error {
		var errs []error
		for _, rv := range found {
			now, ok, err := allocations.Read(filepath.Dir(rv.Path), rv.IP)
			if err != nil || !ok || now.ContainerID != containerID || now.IfName != ifName {
				continue
			}
			if err := os.Remove(rv.Path); err != nil && !errors.Is(err, os.ErrNotExist) {
				errs = append(errs, fmt.Errorf("twill: releasing %s: %w", rv.IP, err))
			}
		}
		return errors.Join(errs...)
	})
}

// releaseElsewhere releases the attachment's addresses in the other
// host-local stores of the data directory, each under that store's own
// lock, as host-local's DEL would: a pod flannel wired (network cbr0) that
// leaves through twill's plugin, whatever twill's network is named, frees
// the address flannel gave it.
func releaseElsewhere(c *NetConf, containerID, ifName string) error {
	stores, err := os.ReadDir(c.DataDir)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil
		}
		return fmt.Errorf("twill: %w", err)
	}
	var errs []error
	for _, st := range stores {
		if !st.IsDir() || st.Name() == c.Name {
			continue
		}
		other := *c
		other.Name = st.Name()
		errs = append(errs, release(&other, containerID, ifName))
	}
	return errors.Join(errs...)
}

// withStore runs fn holding the network's allocation store lock.
func withStore(c *NetConf, fn func(*disk.Store) error) error {
	s, err := store(c)
	if err != nil {
		return err
	}
	defer s.Close()
	if err := s.Lock(); err != nil {
		return fmt.Errorf("twill: locking allocation store: %w", err)
	}
	defer s.Unlock()
	return fn(s)
}

// reservation is one allocation file.
type reservation = allocations.Record

// reservations lists the allocation files of the network (the caller holds
// the store lock when it matters).
func reservations(c *NetConf) ([]reservation, error) {
	return allocations.Records(filepath.Join(c.DataDir, c.Name))
}

// flannelBridge reports whether flannel's bridge is on the node: on a node
// switched from flannel the store is shared with flannel's pods on it,
// which have no twill veth, so none is reclaimed while it is there.
func flannelBridge(linkExists func(string) (bool, error)) bool {
	ok, err := linkExists(takeover.DefaultBridge)
	return ok || err != nil
}
