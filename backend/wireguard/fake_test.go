package wireguard

import (
	"context"
	"fmt"
	"net"
	"slices"
	"sync"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"

	"github.com/twill-net/twill/backend/wireguard/uapi"
)

// fakeDevice models a WireGuard device's configuration as the kernel and
// wireguard-go keep it: a key, a port, and peers by public key, changed
// by a set with the UAPI's semantics.
type fakeDevice struct {
	mu    sync.Mutex
	key   wgtypes.Key
	port  int
	peers map[wgtypes.Key]wgtypes.Peer
	// old: the device is a twill-wg from before the peers query.
	old bool
	// failSet: every Set fails (a device that refuses a change).
	failSet bool
	// whole counts the reads of the whole device (Get).
	whole int
}

var _ Device = (*fakeDevice)(nil)

func (f *fakeDevice) Get(context.Context) (*wgtypes.Device, error) {
	f.mu.Lock()
	f.whole++
	defer f.mu.Unlock()
	d := &wgtypes.Device{PrivateKey: f.key, PublicKey: f.key.PublicKey(), ListenPort: f.port}
	for _, p := range f.peers {
		p.AllowedIPs = slices.Clone(p.AllowedIPs)
		d.Peers = append(d.Peers, p)
	}
	return d, nil
}

// Extensions: a twill-wg of this version, or with old one from before the
// version query, which answers none.
func (f *fakeDevice) Extensions(context.Context) Extensions {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.old {
		return Extensions{}
	}
	return Extensions{Peers: f.Peers}
}

// Peers answers twill-wg's peers query: the peers asked for that the
// device has.
func (f *fakeDevice) Peers(_ context.Context, keys []wgtypes.Key) ([]wgtypes.Peer, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.old {
		return nil, fmt.Errorf("fake: %w", uapi.ErrNoPeersQuery)
	}
	var ps []wgtypes.Peer
	for _, k := range keys {
		if p, ok := f.peers[k]; ok {
			p.AllowedIPs = slices.Clone(p.AllowedIPs)
			ps = append(ps, p)
		}
	}
	return ps, nil
}

func (f *fakeDevice) Set(_ context.Context, cfg wgtypes.Config) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.failSet {
		return fmt.Errorf("fake: the device refuses the change")
	}
	if f.peers == nil {
		f.peers = map[wgtypes.Key]wgtypes.Peer{}
	}
	if cfg.PrivateKey != nil {
		f.key = *cfg.PrivateKey
	}
	if cfg.ListenPort != nil {
		f.port = *cfg.ListenPort
	}
	if cfg.ReplacePeers {
		clear(f.peers)
	}
	for _, pc := range cfg.Peers {
		if pc.Remove {
			delete(f.peers, pc.PublicKey)
			continue
		}
		p, ok := f.peers[pc.PublicKey]
		if !ok && pc.UpdateOnly {
			continue
		}
		p.PublicKey = pc.PublicKey
		if pc.Endpoint != nil {
			p.Endpoint = pc.Endpoint
		}
		if pc.PresharedKey != nil {
			p.PresharedKey = *pc.PresharedKey
		}
		if pc.PersistentKeepaliveInterval != nil {
			p.PersistentKeepaliveInterval = *pc.PersistentKeepaliveInterval
		}
		if pc.ReplaceAllowedIPs {
			p.AllowedIPs = nil
		}
		for _, a := range pc.AllowedIPs {
			// An allowed IP belongs to one peer: adding it takes it from
			// any other.
			for k, o := range f.peers {
				o.AllowedIPs = slices.DeleteFunc(o.AllowedIPs, func(n net.IPNet) bool { return n.String() == a.String() })
				f.peers[k] = o
			}
			p.AllowedIPs = append(p.AllowedIPs, a)
		}
		f.peers[pc.PublicKey] = p
	}
	return nil
}

// fakeDevices is the devices of one node, by name.
type fakeDevices struct {
	mu       sync.Mutex
	devs     map[string]*fakeDevice
	failOpen bool // no device opens (as with no module and no keeper)
}

func (f *fakeDevices) open(name, _ string) (Device, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.failOpen {
		return nil, fmt.Errorf("opening %s: no device", name)
	}
	if f.devs == nil {
		f.devs = map[string]*fakeDevice{}
	}
	if f.devs[name] == nil {
		f.devs[name] = &fakeDevice{}
	}
	return f.devs[name], nil
}

func (f *fakeDevices) dev(name string) *fakeDevice {
	d, _ := f.open(name, "")
	return d.(*fakeDevice)
}

func (f *fakeDevice) describe() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []string
	for _, p := range f.peers {
		var ips []string
		for _, a := range p.AllowedIPs {
			ips = append(ips, a.String())
		}
		slices.Sort(ips)
		out = append(out, fmt.Sprintf("%s %v %v", p.PublicKey.String()[:6], p.Endpoint, ips))
	}
	slices.Sort(out)
	return out
}
