package vxlan

import (
	"fmt"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// Transmit checksum offload on the VTEP (Backend.TXChecksumOffload).
//
// A VTEP leaves the inner packet's checksum to be finished on the way out
// (tx-checksum-ip-generic). Kernels before 5.7 get the outer UDP checksum
// wrong when a vxlan packet so marked is also source-NATed on the way out
// (MASQUERADE with --random-fully, as kube-proxy and twill's own masquerade
// install): the receiver logs "UDP: bad checksum" and drops it, and pods
// reach each other but not Services (flannel #1279, Calico's fix in
// projectcalico/felix#2811). The same can happen on any kernel when the
// underlay itself is NATed. The workaround is to turn the offload off on
// the VTEP, which costs throughput (segmentation offload needs it), so
// twill does it only where it is needed:
//
//	"auto" (default)  off on kernels before 5.7, on otherwise
//	"off"             always off (a NATed underlay, or a distribution kernel
//	                  older than 5.7 in name only that still has the bug)
//	"on"              always on (a pre-5.7 kernel with the fix backported)
//
// The setting is kept like the rest of the device: a reconcile turns it
// back if someone changes it.
const (
	checksumAuto = "auto"
	checksumOn   = "on"
	checksumOff  = "off"
)

// fixedMajor.fixedMinor is the first kernel release whose NAT leaves
// offloaded vxlan checksums intact.
const fixedMajor, fixedMinor = 5, 7

// checkChecksumSetting validates Backend.TXChecksumOffload.
func checkChecksumSetting(s string) error {
	switch s {
	case checksumAuto, checksumOn, checksumOff:
		return nil
	}
	return fmt.Errorf("net-conf.json: Backend.TXChecksumOffload %q: must be %q, %q or %q", s, checksumAuto, checksumOn, checksumOff)
}

// txChecksumWanted is whether the VTEP keeps transmit checksum offload on,
// for a setting and the running kernel's release (uname -r), with why.
func txChecksumWanted(setting, release string) (on bool, why string) {
	switch setting {
	case checksumOn:
		return true, "Backend.TXChecksumOffload is on"
	case checksumOff:
		return false, "Backend.TXChecksumOffload is off"
	}
	v, ok := kernelVersion(release)
	switch {
	case !ok:
		return true, fmt.Sprintf("kernel release %q not understood; assuming it has the fix of 5.7", release)
	case v[0] < fixedMajor || (v[0] == fixedMajor && v[1] < fixedMinor):
		return false, fmt.Sprintf("kernel %d.%d is older than 5.7, whose NAT corrupts offloaded vxlan checksums (flannel #1279)", v[0], v[1])
	}
	return true, fmt.Sprintf("kernel %d.%d has the checksum fix of 5.7", v[0], v[1])
}

// kernelVersion is the major and minor number of a release such as
// "6.1.0-18-amd64" or "4.18.0-348.el8.x86_64".
func kernelVersion(release string) ([2]int, bool) {
	parts := strings.SplitN(release, ".", 3)
	if len(parts) < 2 {
		return [2]int{}, false
	}
	major, err := strconv.Atoi(parts[0])
	if err != nil {
		return [2]int{}, false
	}
	digits := strings.IndexFunc(parts[1], func(r rune) bool { return r < '0' || r > '9' })
	if digits < 0 {
		digits = len(parts[1])
	}
	minor, err := strconv.Atoi(parts[1][:digits])
	if err != nil {
		return [2]int{}, false
	}
	return [2]int{major, minor}, true
}

// kernelRelease is uname -r.
func kernelRelease() string {
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		return ""
	}
	return unix.ByteSliceToString(u.Release[:])
}

// ensureTXChecksum sets the device's offload to on unless it already is,
// and reports whether it had to.
func ensureTXChecksum(k Kernel, name string, on bool) (bool, error) {
	have, err := k.TXChecksum(name)
	if err != nil {
		return false, err
	}
	if have == on {
		return false, nil
	}
	return true, k.SetTXChecksum(name, on)
}

// keepTXChecksum sets the VTEP's offload as chosen, and reports a change
// someone made to a device it did not just create.
func (n *Network) keepTXChecksum(created bool) error {
	changed, err := ensureTXChecksum(n.b.k, n.b.dev.Name, n.b.txChecksum)
	if err != nil {
		return err
	}
	if changed && !created {
		n.b.log.Warn("VTEP transmit checksum offload was changed behind twill's back; set it back",
			"device", n.b.dev.Name, "on", n.b.txChecksum, "because", n.b.txChecksumWhy)
		n.metrics.AddDriftRepairs(1)
	}
	return nil
}
