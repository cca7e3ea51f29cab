// Package vxlan is the vxlan backend: an overlay that carries pod traffic
// between nodes in UDP, so nodes only need IP reachability between them.
//
// How it works. Each node has one VTEP device per VNI, twill.<VNI>, with
// learning off, bound to the external interface and its address, MTU the
// underlay's minus 50 (70 over IPv6), and the network address of each of
// the node's subnets as a /32 (IPv4) and a /128 (IPv6). Its MAC is
// published in the lease as BackendData {"VNI":1,"VtepMAC":"…"} (and the
// same as BackendV6Data when the node has an IPv6 subnet), stays the same
// across restarts and reboots, and is this machine's alone (see mac.go).
// For every peer the node keeps, per pod family the peer has:
//
//	neighbour  <peer VTEP IP> lladdr <peer VTEP MAC> dev twill.1 PERMANENT
//	route      <peer subnet> via <peer VTEP IP> dev twill.1 onlink proto 167
//
// and one FDB entry for both families:
//
//	fdb        <peer VTEP MAC> dev twill.1 dst <peer public IP> self permanent
//
// where the peer's VTEP IP is the network address of its subnet of that
// family. The kernel resolves the route's gateway through the static
// neighbour to the peer's VTEP MAC, and the FDB entry sends frames for
// that MAC to the peer's public IP over UDP (port 8472 by default).
//
// One device carries both pod families, over one underlay family: IPv4
// when the external interface has an IPv4 address, IPv6 otherwise. The FDB
// entry points at the peer's PublicIP or PublicIPv6 accordingly, and pods
// of both families get the same MTU.
//
// Reconcile is level-triggered over all three sets (reconcile.go): the
// desired objects are computed once per peer (desired.go), the three
// sync sets compare them with the kernel, and the changes are applied in an
// order that never leaves a route without its neighbour and FDB entry. A
// peer whose MAC or public IP changed has its entries replaced, a removed
// peer loses all of them, and entries no lease backs are deleted. If the
// device is deleted or altered (VNI, port, MTU, MAC, state), it is
// re-created and every peer replayed (device.go); a link watch makes that
// happen within moments (watch.go). With DirectRouting, a peer family
// whose public IP of that family is on-link gets a host-gw route instead
// and no overlay entries.
//
// A lease walks the files in this order: reconcile.go (Reconcile, Update)
// hands the peers to screen.go (peers refused for their VTEP MAC), then
// record.go (each peer's parsed data and the record of what was programmed
// for it), desired.go (the route, neighbour and FDB entries it calls for),
// plan.go (what to add, replace and delete against the record), and back to
// reconcile.go, which applies the plan in order. mac.go is this node's own
// VTEP MAC; device.go and checksum.go its device; drift.go and watch.go
// compare with and follow the kernel.
package vxlan

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"strconv"

	"github.com/twill-net/twill/backend"
	"github.com/twill-net/twill/backend/kernelsync"
	"github.com/twill-net/twill/nl"
	"github.com/twill-net/twill/subnet"
)

// The name under which the backend registers, and its defaults.
const (
	Type        = "vxlan"
	DefaultVNI  = 1
	DefaultPort = 8472
	// Overheads of the encapsulation: outer IP + UDP + VXLAN + inner Ethernet.
	overheadV4 = 50
	overheadV6 = 70
)

func init() { backend.Register(Type, New) }

// Config is the backend's net-conf.json Backend object.
type Config struct {
	VNI           int
	Port          int
	MTU           int
	DirectRouting bool
	// TXChecksumOffload is "auto", "on" or "off" (checksum.go).
	TXChecksumOffload string
}

// Data is what a node publishes as BackendData (flannel's field names).
type Data struct {
	VNI     int    `json:"VNI"`
	VtepMAC string `json:"VtepMAC"`
}

// Backend is vxlan on one node.
type Backend struct {
	opts backend.Options
	cfg  Config
	log  *slog.Logger
	k    Kernel   // opts.Netlink, or a fake in tests
	dev  nl.VXLAN // the device as it must be
	// txChecksum is whether the device keeps transmit checksum offload
	// on, and txChecksumWhy why (checksum.go).
	txChecksum    bool
	txChecksumWhy string
}

// New is the vxlan Factory.
func New(opts backend.Options) (backend.Backend, error) {
	cfg := Config{VNI: DefaultVNI, Port: DefaultPort, TXChecksumOffload: checksumAuto}
	if err := backend.DecodeConfig(opts.Config.Backend, &cfg); err != nil {
		return nil, err
	}
	if err := checkChecksumSetting(cfg.TXChecksumOffload); err != nil {
		return nil, err
	}
	if cfg.VNI < 1 || cfg.VNI > 1<<24-1 {
		return nil, fmt.Errorf("net-conf.json: Backend.VNI %d: must be between 1 and 16777215", cfg.VNI)
	}
	if cfg.Port < 1 || cfg.Port > 65535 {
		return nil, fmt.Errorf("net-conf.json: Backend.Port %d: must be between 1 and 65535", cfg.Port)
	}
	ext := opts.ExtIface
	local, overhead := underlay(opts.Config, ext)
	if !local.IsValid() && !opts.CheckOnly {
		return nil, fmt.Errorf("vxlan: external interface %s has no IPv4 or IPv6 address to carry the overlay", ext.Link.Name)
	}
	mtu := ext.Link.MTU - overhead
	if opts.CheckOnly {
		mtu = 65535 - overhead // the interface is not known here
	}
	if cfg.MTU != 0 {
		if cfg.MTU < 576 || cfg.MTU > mtu {
			return nil, fmt.Errorf("net-conf.json: Backend.MTU %d: must be between 576 and %d (%s's MTU %d minus %d of encapsulation)",
				cfg.MTU, mtu, ext.Link.Name, ext.Link.MTU, overhead)
		}
		mtu = cfg.MTU
	}
	b := &Backend{opts: opts, cfg: cfg, log: opts.Logger.With("backend", Type)}
	b.k = opts.Netlink
	b.dev = nl.VXLAN{Name: DeviceName(cfg.VNI), VNI: cfg.VNI, Port: cfg.Port, SrcAddr: local, VtepDevIndex: ext.Link.Index, MTU: mtu}
	b.txChecksum, b.txChecksumWhy = txChecksumWanted(cfg.TXChecksumOffload, kernelRelease())
	return b, nil
}

// underlay is the address the overlay runs over, and the encapsulation's
// overhead: the external interface's IPv4 address, unless it has none or
// the pods are IPv6-only and it has an IPv6 one too (so that a node
// publishes, and peers reach it at, an address of the pods' family).
func underlay(cfg *subnet.Config, ext backend.ExternalInterface) (netip.Addr, int) {
	if !ext.Addr.IsValid() || (!cfg.EnableIPv4 && ext.AddrV6.IsValid()) {
		return ext.AddrV6, overheadV6
	}
	return ext.Addr, overheadV4
}

// DeviceName is the VTEP device for a VNI.
func DeviceName(vni int) string { return nl.VXLANDevicePrefix + strconv.Itoa(vni) }

// Prepare creates (or repairs) the VTEP device and publishes its MAC. On
// a node switched from flannel it replaces flannel's device (flannel.go).
func (b *Backend) Prepare(context.Context) (subnet.LeaseAttrs, error) {
	mac, err := b.takeOverFlannel()
	if err != nil {
		return subnet.LeaseAttrs{}, err
	}
	if mac == nil {
		if mac, err = b.vtepMAC(); err != nil {
			return subnet.LeaseAttrs{}, err
		}
	}
	b.dev.HardwareAddr = mac
	if _, _, err := ensureDevice(b.k, b.dev, nil); err != nil {
		return subnet.LeaseAttrs{}, err
	}
	if _, err := ensureTXChecksum(b.k, b.dev.Name, b.txChecksum); err != nil {
		return subnet.LeaseAttrs{}, fmt.Errorf("vxlan: %w", err)
	}
	b.log.Info("VTEP transmit checksum offload", "device", b.dev.Name, "on", b.txChecksum, "because", b.txChecksumWhy)
	ext := b.opts.ExtIface
	attrs := subnet.LeaseAttrs{PublicIP: ext.PublicIP, PublicIPv6: ext.PublicIPv6, BackendType: Type}
	attrs.BackendData, attrs.BackendV6Data = b.data(mac)
	return attrs, nil
}

// data is what the node publishes as BackendData and BackendV6Data: the
// same VNI and MAC, in the fields of the pod families the cluster has.
func (b *Backend) data(mac net.HardwareAddr) (v4, v6 json.RawMessage) {
	d, _ := json.Marshal(Data{VNI: b.cfg.VNI, VtepMAC: mac.String()})
	return b.opts.Config.ForFamilies(d)
}

// Attach returns the Network that programs the peers.
func (b *Backend) Attach(_ context.Context, lease subnet.Lease) (backend.Attached, error) {
	n := &Network{
		b:          b,
		local:      lease,
		vtepIPs:    vtepIPs(lease),
		routes:     &kernelsync.RouteSync{NL: b.k, FullSyncEvery: b.opts.FullSyncEvery, WatchedSyncEvery: b.opts.WatchedSyncEvery, Log: b.log},
		neighs:     &kernelsync.NeighSync{NL: b.k, FullSyncEvery: b.opts.FullSyncEvery, WatchedSyncEvery: b.opts.WatchedSyncEvery},
		fdb:        &kernelsync.NeighSync{NL: b.k, FDB: true, FullSyncEvery: b.opts.FullSyncEvery, WatchedSyncEvery: b.opts.WatchedSyncEvery},
		metrics:    b.opts.Metrics,
		parsed:     map[string]parsed{},
		refused:    &kernelsync.RefusedPeers{Log: b.log, Message: "refusing peers with unusable vxlan backend data (wrong VNI or VTEP MAC)"},
		macRefused: &kernelsync.RefusedPeers{Log: b.log, Message: "refusing peers whose VTEP MAC is not theirs alone"},
	}
	return backend.Attached{Network: n, Updater: n, Watcher: n, External: n, Data: n, Drift: n}, nil
}

// vtepIPs are the device's addresses: the network address of each of the
// node's subnets, as a host prefix.
func vtepIPs(l subnet.Lease) []netip.Prefix {
	var out []netip.Prefix
	for _, p := range []netip.Prefix{l.Subnet, l.IPv6Subnet} {
		if p.IsValid() {
			out = append(out, netip.PrefixFrom(p.Addr(), p.Addr().BitLen()))
		}
	}
	return out
}

// MTU is the VTEP device's.
func (n *Network) MTU() int { return n.b.dev.MTU }
