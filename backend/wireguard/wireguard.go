// Package wireguard is the wireguard backend: pod traffic between nodes is
// encrypted and carried in WireGuard's UDP, so nodes need only IP
// reachability between them and an untrusted network sees nothing but
// ciphertext.
//
// How it works. Each node has a WireGuard device per tunnel: twill-wg
// (listening on ListenPort, peers reached at their IPv4 public address)
// and, in the default "separate" mode of a dual-stack cluster, twill-wg-v6
// (ListenPortV6, peers' IPv6 public address); the "auto", "ipv4" and
// "ipv6" modes carry both pod families in twill-wg over one underlay
// family. The device holds the node's private key, kept in the state
// directory (wireguard.key, 0600) so that it survives restarts and
// reboots; the public key is published in the lease's backend data as
// {"PublicKey":"<base64>"} (flannel's field). The device's address is the
// network address of each subnet it carries, as a host prefix, and for
// every peer the node keeps:
//
//	wireguard peer  <peer PublicKey> endpoint <peer public IP>:<port>
//	                allowed-ips <peer subnet(s)> [preshared-key] [keepalive]
//	route           <peer subnet> dev twill-wg proto 167
//
// The device is the kernel's when the wireguard module is there
// (configured over generic netlink with wgctrl), and otherwise a
// userspace device (wireguard-go) in a process of its own, twill-wg,
// which twilld starts and finds again through a socket in its state
// directory: a twilld restart never takes the device down.
//
// Reconcile is level-triggered like the other backends: the desired peers
// are a pure function of the leases (peers.go), diffed against the device
// and applied in one transaction, then the routes. A poll of the device
// and the route watch notice hand-made changes (a peer removed or
// altered, the device deleted) and poke a reconcile.
package wireguard

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"strings"
	"time"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"

	"github.com/twill-net/twill/backend"
	"github.com/twill-net/twill/nl"
	"github.com/twill-net/twill/subnet"
)

// Type is the name under which the backend registers.
const Type = "wireguard"

func init() { backend.Register(Type, New) }

// Defaults and limits.
const (
	DefaultListenPort   = 51820
	DefaultListenPortV6 = 51821
	// Device names: the IPv4 (or only) tunnel's, and the IPv6 tunnel's in
	// separate mode.
	DeviceName   = nl.WireGuardDevicePrefix
	DeviceNameV6 = nl.WireGuardDevicePrefix + "-v6"
	// Overheads of the encapsulation: outer IP + UDP + WireGuard's header
	// and authentication tag.
	overheadV4 = 60
	overheadV6 = 80
	minMTU     = 1280
)

// Modes (flannel's): which tunnels carry which pod families.
const (
	ModeSeparate = "separate" // one device per pod family, over that family
	ModeAuto     = "auto"     // one device, over IPv4 if the node has it
	ModeIPv4     = "ipv4"     // one device, over IPv4
	ModeIPv6     = "ipv6"     // one device, over IPv6
)

// Config is the backend's net-conf.json Backend object; the fields are
// flannel's wireguard backend's, plus KeyRotationInterval.
type Config struct {
	PSK          string
	ListenPort   int
	ListenPortV6 int
	Mode         string
	// PersistentKeepaliveInterval is in seconds; 0 turns it off.
	PersistentKeepaliveInterval int
	MTU                         int
	// KeyRotationInterval ("720h") makes twilld replace its key pair that
	// often; empty or "0" never.
	KeyRotationInterval string
}

// Data is what a node publishes as BackendData (and BackendV6Data).
type Data struct {
	PublicKey string `json:"PublicKey"`
}

// settings is Config checked and resolved.
type settings struct {
	psk       *wgtypes.Key
	keepalive time.Duration
	rotate    time.Duration
	mode      string
	mtu       int // 0: derived from the underlay
	port      int
	portV6    int
}

func parseConfig(raw json.RawMessage) (settings, error) {
	c := Config{ListenPort: DefaultListenPort, ListenPortV6: DefaultListenPortV6, Mode: ModeSeparate}
	if err := backend.DecodeConfig(raw, &c); err != nil {
		return settings{}, err
	}
	s := settings{mode: c.Mode, port: c.ListenPort, portV6: c.ListenPortV6, mtu: c.MTU}
	if !slices.Contains([]string{ModeSeparate, ModeAuto, ModeIPv4, ModeIPv6}, c.Mode) {
		return s, fmt.Errorf("net-conf.json: Backend.Mode %q: must be one of separate, auto, ipv4, ipv6", c.Mode)
	}
	if c.ListenPort < 1 || c.ListenPort > 65535 {
		return s, fmt.Errorf("net-conf.json: Backend.ListenPort %d: must be between 1 and 65535", c.ListenPort)
	}
	if c.ListenPortV6 < 1 || c.ListenPortV6 > 65535 {
		return s, fmt.Errorf("net-conf.json: Backend.ListenPortV6 %d: must be between 1 and 65535", c.ListenPortV6)
	}
	if c.PersistentKeepaliveInterval < 0 || c.PersistentKeepaliveInterval > 65535 {
		return s, fmt.Errorf("net-conf.json: Backend.PersistentKeepaliveInterval %d: must be between 0 and 65535 seconds", c.PersistentKeepaliveInterval)
	}
	s.keepalive = time.Duration(c.PersistentKeepaliveInterval) * time.Second
	if c.MTU != 0 && (c.MTU < minMTU || c.MTU > 65535) {
		return s, fmt.Errorf("net-conf.json: Backend.MTU %d: must be between %d and 65535", c.MTU, minMTU)
	}
	if c.PSK != "" {
		k, err := wgtypes.ParseKey(c.PSK)
		if err != nil {
			return s, fmt.Errorf("net-conf.json: Backend.PSK: not a base64 WireGuard key (make one with `wg genpsk`): %w", err)
		}
		s.psk = &k
	}
	if c.KeyRotationInterval != "" && c.KeyRotationInterval != "0" {
		d, err := time.ParseDuration(c.KeyRotationInterval)
		if err != nil || d < time.Minute {
			return s, fmt.Errorf("net-conf.json: Backend.KeyRotationInterval %q: must be a duration of at least 1m (\"720h\"), or \"0\"", c.KeyRotationInterval)
		}
		s.rotate = d
	}
	return s, nil
}

// tunnel is one device: its name, port, underlay family and the pod
// families it carries.
type tunnel struct {
	name string
	port int
	v6   bool // the underlay is IPv6
	pod4 bool // it carries IPv4 pod subnets
	pod6 bool // it carries IPv6 pod subnets
	mtu  int
}

func (t tunnel) String() string { return t.name }

// tunnels works out the devices the configuration calls for on a node with
// ext as its underlay.
func tunnels(s settings, cfg *subnet.Config, ext backend.ExternalInterface, checkOnly bool) ([]tunnel, error) {
	has4, has6 := ext.Addr.IsValid() || checkOnly, ext.AddrV6.IsValid() || checkOnly
	var ts []tunnel
	switch s.mode {
	case ModeSeparate:
		if cfg.EnableIPv4 {
			ts = append(ts, tunnel{name: DeviceName, port: s.port, pod4: true})
		}
		if cfg.EnableIPv6 {
			ts = append(ts, tunnel{name: DeviceNameV6, port: s.portV6, v6: true, pod6: true})
		}
	case ModeAuto:
		ts = append(ts, tunnel{name: DeviceName, port: s.port, v6: !has4, pod4: cfg.EnableIPv4, pod6: cfg.EnableIPv6})
	case ModeIPv4, ModeIPv6:
		ts = append(ts, tunnel{name: DeviceName, port: s.port, v6: s.mode == ModeIPv6, pod4: cfg.EnableIPv4, pod6: cfg.EnableIPv6})
	}
	for i, t := range ts {
		if t.v6 && !has6 || !t.v6 && !has4 {
			fam := "IPv4"
			if t.v6 {
				fam = "IPv6"
			}
			return nil, fmt.Errorf("wireguard: Mode %q needs an %s address on %s for %s, and it has none", s.mode, fam, ext.Link.Name, t.name)
		}
		overhead := overheadV4
		if t.v6 {
			overhead = overheadV6
		}
		ts[i].mtu = ext.Link.MTU - overhead
		if checkOnly {
			ts[i].mtu = 65535 - overhead
		}
		if s.mtu != 0 {
			if s.mtu > ts[i].mtu {
				return nil, fmt.Errorf("net-conf.json: Backend.MTU %d: must be at most %d (%s's MTU %d minus %d of encapsulation)", s.mtu, ts[i].mtu, ext.Link.Name, ext.Link.MTU, overhead)
			}
			ts[i].mtu = s.mtu
		}
	}
	if len(ts) == 0 {
		return nil, fmt.Errorf("wireguard: the network has no pod family to carry")
	}
	return ts, nil
}

// Backend is wireguard on one node.
type Backend struct {
	opts    backend.Options
	s       settings
	log     *slog.Logger
	tunnels []tunnel
	keys    *keyStore
	devices *devices
}

// New is the wireguard Factory.
func New(opts backend.Options) (backend.Backend, error) {
	s, err := parseConfig(opts.Config.Backend)
	if err != nil {
		return nil, err
	}
	ts, err := tunnels(s, opts.Config, opts.ExtIface, opts.CheckOnly)
	if err != nil {
		return nil, err
	}
	b := &Backend{opts: opts, s: s, log: opts.Logger.With("backend", Type), tunnels: ts}
	if opts.CheckOnly {
		return b, nil
	}
	b.keys = &keyStore{path: keyPath(opts.StateDir)}
	b.devices = newDevices(opts, b.log)
	return b, nil
}

// Prepare loads (or makes) the key pair, creates the devices and publishes
// the public key.
func (b *Backend) Prepare(ctx context.Context) (subnet.LeaseAttrs, error) {
	key, err := b.keys.load()
	if err != nil {
		return subnet.LeaseAttrs{}, err
	}
	for _, t := range b.tunnels {
		if err := b.prepareDevice(ctx, t, key); err != nil {
			return subnet.LeaseAttrs{}, err
		}
	}
	ext := b.opts.ExtIface
	attrs := subnet.LeaseAttrs{PublicIP: ext.PublicIP, PublicIPv6: ext.PublicIPv6, BackendType: Type}
	attrs.BackendData, attrs.BackendV6Data = b.data(key.PublicKey())
	return attrs, nil
}

// prepareDevice makes t's device and gives it the key and port, so that
// peers can reach the node as soon as they learn its key; peers are left
// as they are until the first Reconcile.
func (b *Backend) prepareDevice(ctx context.Context, t tunnel, key wgtypes.Key) error {
	dev, _, err := b.devices.ensure(ctx, t, nil)
	if err != nil {
		return err
	}
	have, err := dev.Get(ctx)
	if err != nil {
		return err
	}
	var cfg wgtypes.Config
	if have.PrivateKey != key {
		cfg.PrivateKey = &key
	}
	if have.ListenPort != t.port {
		cfg.ListenPort = &t.port
	}
	if cfg.PrivateKey == nil && cfg.ListenPort == nil {
		return nil
	}
	return dev.Set(ctx, cfg)
}

// data is the node's BackendData and BackendV6Data: its public key, in the
// fields of the pod families the cluster has.
func (b *Backend) data(pub wgtypes.Key) (v4, v6 json.RawMessage) {
	d, _ := json.Marshal(Data{PublicKey: pub.String()})
	return b.opts.Config.ForFamilies(d)
}

// Attach returns the Network that programs the peers.
func (b *Backend) Attach(_ context.Context, lease subnet.Lease) (backend.Attached, error) {
	// The key Prepare loaded; twillctl status, which does not Prepare,
	// reads the stored one and makes none.
	key, _ := b.keys.peek()
	n := newNetwork(b, lease, key)
	return backend.Attached{Network: n, Updater: n, Watcher: n, Runner: n, Data: n, Drift: n, Status: n}, nil
}

func famName(v6 bool) string {
	if v6 {
		return "IPv6"
	}
	return "IPv4"
}

func prefixList(ps []netip.Prefix) string {
	s := make([]string, len(ps))
	for i, p := range ps {
		s[i] = p.String()
	}
	return strings.Join(s, ",")
}
