package userspace

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.zx2c4.com/wireguard/tun/tuntest"
	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"

	"github.com/twill-net/twill/backend/wireguard/uapi"
)

// TestServesTheUserspaceAPI: a device run on an in-memory TUN is
// configured and read back through its socket, refuses a second device on
// the same socket, and takes its socket and PID file with it when it stops.
func TestServesTheUserspaceAPI(t *testing.T) {
	dir := t.TempDir()
	sock, pidf := filepath.Join(dir, "wg.sock"), filepath.Join(dir, "wg.pid")
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	go func() {
		done <- Run(ctx, Options{Logger: log, Name: "wgtest", Socket: sock, PIDFile: pidf, TUN: tuntest.NewChannelTUN().TUN(), Bind: &DiscardBind{}})
	}()
	c := &uapi.Client{Path: sock}
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, err := c.Get(ctx); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the device never served its socket")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if fi, err := os.Stat(sock); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("socket %v %v: want mode 0600", fi, err)
	}
	priv, _ := wgtypes.GeneratePrivateKey()
	peer, _ := wgtypes.GeneratePrivateKey()
	port := 51820
	_, ipnet, _ := net.ParseCIDR("10.244.2.0/24")
	err := c.Set(ctx, wgtypes.Config{PrivateKey: &priv, ListenPort: &port, Peers: []wgtypes.PeerConfig{{
		PublicKey: peer.PublicKey(), Endpoint: net.UDPAddrFromAddrPort(netip.MustParseAddrPort("127.0.0.1:51999")),
		AllowedIPs: []net.IPNet{*ipnet}, ReplaceAllowedIPs: true,
	}}})
	if err != nil {
		t.Fatal(err)
	}
	g1, err := c.Generation(ctx)
	if err != nil || g1 == 0 {
		t.Fatalf("generation after a set: %d, %v", g1, err)
	}
	d, err := c.Get(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if g2, err := c.Generation(ctx); err != nil || g2 != g1 {
		t.Fatalf("a get moved the generation: %d -> %d (%v)", g1, g2, err)
	}
	if d.PublicKey != priv.PublicKey() || len(d.Peers) != 1 || d.Peers[0].PublicKey != peer.PublicKey() ||
		d.Peers[0].Endpoint.String() != "127.0.0.1:51999" || len(d.Peers[0].AllowedIPs) != 1 || d.Peers[0].AllowedIPs[0].String() != "10.244.2.0/24" {
		t.Fatalf("device read back as %+v", d)
	}
	// A set the device refuses is an error.
	bad := wgtypes.Config{Peers: []wgtypes.PeerConfig{{PublicKey: peer.PublicKey(), Endpoint: &net.UDPAddr{IP: net.IPv4zero, Port: 0}}}}
	if err := c.Set(ctx, bad); err != nil && !strings.Contains(err.Error(), "refused") {
		t.Fatalf("unexpected error %v", err)
	}
	if err := Run(ctx, Options{Logger: log, Name: "wgtest2", Socket: sock, TUN: tuntest.NewChannelTUN().TUN(), Bind: &DiscardBind{}}); err == nil || !strings.Contains(err.Error(), "already serves") {
		t.Fatalf("a second device on the same socket: %v", err)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{sock, pidf} {
		if _, err := os.Stat(f); !os.IsNotExist(err) {
			t.Errorf("%s left behind (%v)", f, err)
		}
	}
	if _, err := c.Get(context.Background()); err == nil {
		t.Fatal("the socket still answers after the device stopped")
	}
}
