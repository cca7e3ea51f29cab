package e2e

import (
	"context"
	"crypto/sha256"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"

	"github.com/twill-net/twill/backend/wireguard"
	"github.com/twill-net/twill/backend/wireguard/uapi"
	twcluster "github.com/twill-net/twill/lab/cluster"
	"github.com/twill-net/twill/nl"
	"github.com/twill-net/twill/testsupport/netnstest"
)

// wireguardBenchSizes are the wireguard backend's points of the scale
// curve.
var wireguardBenchSizes = []int{1000, 5000}

// benchWGKey is the i-th synthetic peer's public key.
func benchWGKey(i int) string {
	sum := sha256.Sum256([]byte("twill-bench-" + strconv.Itoa(i)))
	priv, _ := wgtypes.NewKey(sum[:])
	return priv.PublicKey().String()
}

// requireWireGuardPeers checks node1's device holds the n peers.
func requireWireGuardPeers(b *testing.B, c *cluster, n int) {
	b.Helper()
	d, err := c.wgDevice(0)
	if err != nil || len(d.Peers) != n {
		b.Fatalf("node1's device: %v, %d peers, want %d", err, peerCount(d), n)
	}
}

func peerCount(d *wgtypes.Device) int {
	if d == nil {
		return -1
	}
	return len(d.Peers)
}

// wireGuardPID is node1's twill-wg.
func wireGuardPID(b *testing.B, c *cluster) int {
	b.Helper()
	raw, err := os.ReadFile(wireguard.PIDFile(twcluster.NodeDir(c.dir, c.topo.Nodes[0].Name), wireguard.DeviceName))
	if err != nil {
		b.Fatal(err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(raw)))
	if err != nil {
		b.Fatal(err)
	}
	return pid
}

// wireGuardFloor is the fastest of floorRuns runs of wireGuardFloorOnce.
func wireGuardFloor(b *testing.B, bin string, n int) time.Duration {
	return fastestOf(floorRuns, func() time.Duration { return wireGuardFloorOnce(b, bin, n) })
}

// wireGuardFloorOnce is what the same peers cost without twilld: a fresh
// twill-wg device in a fresh namespace, given the n peers in one
// userspace-API set (the request `wg setconf` sends; wg itself only finds
// devices under /var/run/wireguard) and the n routes through it by
// `ip -batch`, timed until the route watch has seen every route.
func wireGuardFloorOnce(b *testing.B, bin string, n int) time.Duration {
	ns := netnstest.New(b, "floor")
	netnstest.Uplink(b, ns, "192.168.0.1/16")
	dir := b.TempDir()
	sock := filepath.Join(dir, "twill-wg.sock")
	dev := start(b, ns, filepath.Join(dir, "twill-wg.log"), bin+"/twill-wg", "--name", "twill-wg", "--socket", sock, "--mtu", "1440")
	defer dev.Stop(b)
	cl := &uapi.Client{Path: sock}
	waitFor(b, 10*time.Second, "the floor's twill-wg", func() bool { _, err := cl.Get(context.Background()); return err == nil })
	netnstest.IP(b, ns, "link", "set", "twill-wg", "up")
	priv, _ := wgtypes.GeneratePrivateKey()
	port := wireguard.DefaultListenPort
	cfg := wgtypes.Config{PrivateKey: &priv, ListenPort: &port}
	var routes strings.Builder
	for i := range n {
		_, _, dst := benchLease("wireguard", i)
		k, _ := wgtypes.ParseKey(benchWGKey(i))
		cfg.Peers = append(cfg.Peers, wgtypes.PeerConfig{PublicKey: k, ReplaceAllowedIPs: true,
			Endpoint:   net.UDPAddrFromAddrPort(netip.AddrPortFrom(benchPeerIP(i), uint16(port))),
			AllowedIPs: []net.IPNet{{IP: dst.Addr().AsSlice(), Mask: net.CIDRMask(24, 32)}}})
		fmt.Fprintf(&routes, "route add %s dev twill-wg proto 167 metric %d\n", dst, nl.RouteMetric(dst))
	}
	path := filepath.Join(dir, "ip.batch")
	if err := os.WriteFile(path, []byte(routes.String()), 0o644); err != nil {
		b.Fatal(err)
	}
	watch := watchRoutes(b, ns)
	defer watch.stop()
	t0 := time.Now()
	if err := cl.Set(context.Background(), cfg); err != nil {
		b.Fatal(err)
	}
	if out, err := exec.Command("ip", "-n", ns, "-batch", path).CombinedOutput(); err != nil {
		b.Fatalf("ip -batch: %v: %s", err, out)
	}
	if err := watch.waitCount(n, time.Duration(60+n/500)*time.Second); err != nil {
		b.Fatal(err)
	}
	return time.Since(t0)
}
