// What twill owns: every kernel object identity twill claims as its own:
// the rtnetlink protocol stamped on its routes, its route tables, its policy
// rule priorities and its iptables chains. Keeping them in one file makes it
// possible to audit what twill may touch, and what cleanup removes.

package nl

import (
	"crypto/sha256"
	"encoding/hex"
	"net/netip"
)

// RouteProtocol is the rtnetlink protocol number (rtm_protocol) on every
// route twill installs. Reconcilers list routes filtered by it, so they find
// and delete their own stale routes without ever touching anyone else's.
// 167 is not registered in iproute2's rt_protos nor used by the common CNIs.
const RouteProtocol = 167

// RouteMetric is the metric (RTA_PRIORITY) of twill's route to dst: a
// number of its own per destination, from 1,048,576 up. The kernel keeps
// one record per distinct (gateway device, protocol, metric, ...) and
// finds it by a hash that leaves the gateway out: with one metric for all,
// every route through one device falls in one hash chain, and adding a
// route walks all of them (20,000 host-gw routes took 15 s to add, one
// more took milliseconds). A metric per destination spreads them (0.36 s
// for the 20,000). Routes of anyone else's to the same destination keep
// winning when their metric is lower, as the kernel's default 0 is.
func RouteMetric(dst netip.Prefix) int {
	a := dst.Masked().Addr()
	var x uint32
	if a.Is4() {
		b := a.As4()
		x = uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3])
		x >>= 32 - max(min(dst.Bits(), 32), 8)
	} else {
		b := a.As16()
		for _, c := range b[:max(min(dst.Bits(), 128), 8)/8] {
			x = x*16777619 ^ uint32(c)
		}
	}
	return 1<<20 + int(x&(1<<20-1))
}

// PodRouteProtocol marks the /32 (/128) routes the CNI plugin installs
// towards its pods. It differs from RouteProtocol because the daemon's
// reconcilers delete every RouteProtocol route no lease backs; pod routes
// belong to the plugin and are removed by CNI DEL and GC.
const PodRouteProtocol = 168

// PodLinkPrefix starts the name of every host-side pod veth ("tw" + hash).
const PodLinkPrefix = "tw"

// PodLinkName is the host end's name for an attachment: "tw" and 13 hex
// digits of a hash of the container ID and interface name. The plugin
// names veths by it, and finds them again by it (DEL, GC, reclaiming
// allocations whose pod is gone).
func PodLinkName(containerID, ifName string) string {
	sum := sha256.Sum256([]byte(containerID + "/" + ifName))
	return PodLinkPrefix + hex.EncodeToString(sum[:])[:13]
}

// PodLinkAliasPrefix starts the alias of every host-side pod veth:
// "twill/<network>/<container ID>/<ifname>". GC finds stale links by it.
const PodLinkAliasPrefix = "twill/"

// MainTable is the kernel's main routing table (RT_TABLE_MAIN).
const MainTable = 254

// Policy routing (eni backend and CNI plugin).
const (
	// ENIRouteTable is the default route table for a node's ENI.
	ENIRouteTable = 100
	// RulePriorityToPod sends traffic addressed to a local pod through main.
	RulePriorityToPod = 512
	// RulePriorityFromPod sends traffic from a pod through the ENI table.
	RulePriorityFromPod = 1536
)

// iptables chains. Each is jumped to from one built-in chain; cleanup removes
// the jump, then the chain.
const (
	ChainMasquerade = "TWILL-POSTRTG" // nat table, from POSTROUTING
	ChainForward    = "TWILL-FWD"     // filter table, from FORWARD
)

// VXLANDevicePrefix is the name prefix of twill's VTEP devices ("twill.<VNI>").
const VXLANDevicePrefix = "twill."

// WireGuardDevicePrefix is the name prefix of twill's WireGuard devices
// ("twill-wg", "twill-wg-v6").
const WireGuardDevicePrefix = "twill-wg"
