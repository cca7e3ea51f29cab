package vxlan

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"

	"github.com/twill-net/twill/backend"
	"github.com/twill-net/twill/internal/atomicfile"
)

// The VTEP MAC and the node's identity.
//
// A node's VTEP MAC must be unique in the cluster, and stay the same across
// restarts. It is derived from the node's identity (the external
// interface's MAC, the public IP, the VNI) and kept in the state directory
// with that identity. A state directory copied to another machine (a node
// image with /var/lib/twill baked in) holds another node's identity, so its
// MAC is not trusted: the node derives its own. Should two nodes still
// publish one MAC (nodes cloned down to their interface MACs and public
// address, or a MAC taken by hand), the node whose subnet is the higher
// picks a random MAC, keeps it in its state, and publishes it; meanwhile
// every node refuses the peers whose MAC is not theirs alone, rather than
// send one node's traffic to another.

// macState is the state file's content.
type macState struct {
	VtepMAC  string `json:"VtepMAC"`
	Identity string `json:"Identity"`
}

func (b *Backend) macPath() string {
	return filepath.Join(b.opts.StateDir, fmt.Sprintf("vxlan-%d.mac", b.cfg.VNI))
}

// Identity names the machine a VTEP MAC was chosen on.
func Identity(extMAC net.HardwareAddr, publicIP netip.Addr, vni int) string {
	sum := sha256.Sum256(fmt.Appendf(nil, "twill-vtep/%x/%s/%d", []byte(extMAC), publicIP, vni))
	return hex.EncodeToString(sum[:16])
}

func (b *Backend) identity() string {
	ext := b.opts.ExtIface
	return Identity(ext.Link.HardwareAddr, ext.PublicIP, b.cfg.VNI)
}

// derivedMAC is the MAC this node's identity gives.
func (b *Backend) derivedMAC() net.HardwareAddr {
	ext := b.opts.ExtIface
	sum := sha256.Sum256(fmt.Appendf(nil, "twill-vtep/%x/%s/%d", []byte(ext.Link.HardwareAddr), ext.PublicIP, b.cfg.VNI))
	return localMAC(sum[:6])
}

// localMAC makes 6 bytes a unicast, locally administered MAC.
func localMAC(b []byte) net.HardwareAddr {
	mac := net.HardwareAddr(bytes.Clone(b[:6]))
	mac[0] = mac[0]&0xfe | 0x02
	return mac
}

// vtepMAC returns the MAC kept in the state directory when it was chosen on
// this machine, and otherwise the derived one (stored for next time).
func (b *Backend) vtepMAC() (net.HardwareAddr, error) {
	path := b.macPath()
	derived := b.derivedMAC()
	if raw, err := os.ReadFile(path); err == nil {
		var st macState
		if json.Unmarshal(raw, &st) != nil {
			// The format before identities: a bare MAC, trusted only if
			// this machine would derive it.
			st = macState{VtepMAC: strings.TrimSpace(string(raw))}
			if st.VtepMAC == derived.String() {
				st.Identity = b.identity()
			}
		}
		mac, perr := net.ParseMAC(st.VtepMAC)
		switch {
		case perr != nil || len(mac) != 6:
			b.log.Warn("ignoring an unreadable VTEP MAC file", "path", path)
		case st.Identity != b.identity():
			b.log.Warn("the stored VTEP MAC was chosen on another machine (a copied state directory?); using this machine's own",
				"path", path, "stored", mac, "mac", derived)
		default:
			return mac, nil
		}
	}
	b.storeMAC(derived)
	return derived, nil
}

// storeMAC keeps mac, with this machine's identity, in the state directory.
func (b *Backend) storeMAC(mac net.HardwareAddr) {
	if b.opts.StateDir == "" {
		return
	}
	data, _ := json.Marshal(macState{VtepMAC: mac.String(), Identity: b.identity()})
	if err := atomicfile.Write(b.macPath(), append(data, '\n'), 0o600); err != nil {
		b.log.Warn("could not store the VTEP MAC; it is derived again next time", "path", b.macPath(), "err", err)
	}
}

// randomMAC is a new locally administered MAC that none of taken uses.
func randomMAC(taken func(net.HardwareAddr) bool) net.HardwareAddr {
	for {
		var b [6]byte
		_, _ = rand.Read(b[:])
		if m := localMAC(b[:]); !taken(m) {
			return m
		}
	}
}

var _ backend.DataPublisher = (*Network)(nil)

// BackendData returns the backend data to publish when it changed since
// the lease was taken (a new VTEP MAC), once.
func (n *Network) BackendData() (v4, v6 json.RawMessage, changed bool) {
	v4, v6, changed = n.pending, n.pending6, n.hasPending
	n.pending, n.pending6, n.hasPending = nil, nil, false
	return v4, v6, changed
}
