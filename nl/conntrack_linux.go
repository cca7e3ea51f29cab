package nl

import (
	"errors"
	"fmt"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// ForgetUDPToPorts deletes, in the caller's namespace, the conntrack
// entries of UDP flows whose original destination port is one of ports,
// of both families, and says how many went. A UDP flow's entry outlives
// the DNAT that made it while its client keeps sending: a host port
// taken over by a new pod would otherwise go on reaching the old one.
func ForgetUDPToPorts(ports ...uint16) (uint, error) {
	if len(ports) == 0 {
		return 0, nil
	}
	filters := make([]netlink.CustomConntrackFilter, 0, len(ports))
	for _, p := range ports {
		f := &netlink.ConntrackFilter{}
		if err := f.AddProtocol(unix.IPPROTO_UDP); err != nil {
			return 0, fmt.Errorf("conntrack filter: %w", err)
		}
		if err := f.AddPort(netlink.ConntrackOrigDstPort, p); err != nil {
			return 0, fmt.Errorf("conntrack filter for port %d: %w", p, err)
		}
		filters = append(filters, f)
	}
	var total uint
	var errs []error
	for _, fam := range []netlink.InetFamily{unix.AF_INET, unix.AF_INET6} {
		n, err := netlink.ConntrackDeleteFilters(netlink.ConntrackTable, fam, filters...)
		total += n
		if err != nil {
			errs = append(errs, fmt.Errorf("deleting UDP conntrack entries to ports %v: %w", ports, err))
		}
	}
	return total, errors.Join(errs...)
}
