// Package allocations reads and reclaims the twill CNI plugin's address
// allocations, which use host-local's on-disk layout: one file per address
// in <dataDir>/<network>/, named by the address and holding
// "<container ID>\r\n<ifname>".
//
// Container runtimes that never call CNI GC (containerd 1.6 and 1.7) leave
// an allocation behind whenever a DEL never comes: a reboot, a runtime
// crash, a sandbox lost. Sooner or later the node runs out of addresses.
// An allocation whose pod interface is gone (the host end of its veth no
// longer exists: the pod's network namespace was destroyed) is stale, and
// Reclaim frees it, after a grace period so that an ADD between reserving
// its address and creating its veth is never robbed.
package allocations

import (
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/containernetworking/plugins/plugins/ipam/host-local/backend/disk"

	"github.com/twill-net/twill/nl"
)

// Grace is how old an allocation without its veth must be to be reclaimed.
const Grace = 10 * time.Second

// Record is one allocation file.
type Record struct {
	IP          netip.Addr
	ContainerID string
	IfName      string
	Path        string
	ModTime     time.Time
}

// HeldElsewhere returns the addresses of subnets that the other host-local
// stores of dataDir hold: networks of another name than network, such as
// flannel's cbr0 on a node being switched from flannel, whose running pods
// keep the addresses flannel's host-local gave them. Twill's plugin never
// hands those out, whatever its own network is named. It reads directory
// names only.
func HeldElsewhere(dataDir, network string, subnets ...netip.Prefix) (map[netip.Addr]bool, error) {
	stores, err := os.ReadDir(dataDir)
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", dataDir, err)
	}
	var held map[netip.Addr]bool
	for _, st := range stores {
		if !st.IsDir() || st.Name() == network {
			continue
		}
		ents, err := os.ReadDir(filepath.Join(dataDir, st.Name()))
		if err != nil {
			return nil, fmt.Errorf("reading %s: %w", filepath.Join(dataDir, st.Name()), err)
		}
		for _, e := range ents {
			ip, err := netip.ParseAddr(e.Name())
			if err != nil {
				continue // lock, last_reserved_ip.*
			}
			for _, p := range subnets {
				if p.Contains(ip) {
					if held == nil {
						held = map[netip.Addr]bool{}
					}
					held[ip] = true
				}
			}
		}
	}
	return held, nil
}

// Records lists the allocation files of a host-local store directory (the
// caller holds the store's lock when it matters).
func Records(dir string) ([]Record, error) {
	ents, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", dir, err)
	}
	var out []Record
	for _, e := range ents {
		ip, err := netip.ParseAddr(e.Name())
		if err != nil || e.IsDir() {
			continue // lock, last_reserved_ip.*, or not an allocation
		}
		path := filepath.Join(dir, e.Name())
		data, err := os.ReadFile(path)
		if err != nil {
			continue
		}
		info, err := e.Info()
		if err != nil {
			continue
		}
		out = append(out, parse(ip, path, data, info.ModTime()))
	}
	return out, nil
}

// Read reads the allocation file of ip in a store directory; ok is false
// when there is none.
func Read(dir string, ip netip.Addr) (r Record, ok bool, err error) {
	path := filepath.Join(dir, ip.String())
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return Record{}, false, nil
	}
	if err != nil {
		return Record{}, false, fmt.Errorf("reading %s: %w", path, err)
	}
	defer f.Close()
	info, err := f.Stat()
	if err != nil {
		return Record{}, false, fmt.Errorf("reading %s: %w", path, err)
	}
	data, err := io.ReadAll(io.LimitReader(f, 4096))
	if err != nil {
		return Record{}, false, fmt.Errorf("reading %s: %w", path, err)
	}
	return parse(ip, path, data, info.ModTime()), true, nil
}

func parse(ip netip.Addr, path string, data []byte, mod time.Time) Record {
	id, ifn, _ := strings.Cut(strings.TrimSpace(string(data)), disk.LineBreak)
	return Record{IP: ip, ContainerID: strings.TrimSpace(id), IfName: strings.TrimSpace(ifn), Path: path, ModTime: mod}
}

// Reclaim removes the allocations in dir whose host veth (by its name,
// nl.PodLinkName) does not exist and that are older than grace, and
// returns them. The caller holds the store's lock.
func Reclaim(dir string, grace time.Duration, now time.Time, linkExists func(name string) (bool, error)) ([]Record, error) {
	recs, err := Records(dir)
	if err != nil {
		return nil, err
	}
	var gone []Record
	var errs []error
	for _, r := range recs {
		if now.Sub(r.ModTime) < grace || r.ContainerID == "" {
			continue
		}
		ok, err := linkExists(nl.PodLinkName(r.ContainerID, r.IfName))
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if ok {
			continue
		}
		if err := os.Remove(r.Path); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, fmt.Errorf("releasing %s: %w", r.IP, err))
			continue
		}
		gone = append(gone, r)
	}
	return gone, errors.Join(errs...)
}

// Store opens (and locks) the store of a network; unlock and close it with
// the returned function.
func Store(dataDir, network string) (func(), error) {
	s, err := disk.New(network, dataDir)
	if err != nil {
		return nil, fmt.Errorf("opening allocation store %s: %w", filepath.Join(dataDir, network), err)
	}
	if err := s.Lock(); err != nil {
		s.Close()
		return nil, fmt.Errorf("locking allocation store %s: %w", filepath.Join(dataDir, network), err)
	}
	return func() { s.Unlock(); s.Close() }, nil
}
