package userspace

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.zx2c4.com/wireguard/device"
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
	c := waitServing(t, sock)
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

// waitServing waits for a device to answer a get on sock.
func waitServing(t *testing.T, sock string) *uapi.Client {
	t.Helper()
	c := &uapi.Client{Path: sock}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if _, err := c.Get(context.Background()); err == nil {
			return c
		}
		if time.Now().After(deadline) {
			t.Fatal("the device never served its socket")
		}
	}
}

// A peers query reads back the peers asked for and no others, with no
// device fields (the private key stays in the device); a malformed one is
// refused; a device that does not know the query (wireguard-go's own
// socket) is told apart from a failure.
func TestAnswersAPeersQuery(t *testing.T) {
	dir := t.TempDir()
	sock := filepath.Join(dir, "wg.sock")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	go func() {
		_ = Run(ctx, Options{Logger: log, Name: "wgtest", Socket: sock, TUN: tuntest.NewChannelTUN().TUN(), Bind: &DiscardBind{}})
	}()
	c := waitServing(t, sock)
	priv, _ := wgtypes.GeneratePrivateKey()
	var peers []wgtypes.PeerConfig
	var keys []wgtypes.Key
	for i := range 3 {
		k, _ := wgtypes.GeneratePrivateKey()
		keys = append(keys, k.PublicKey())
		_, ipnet, _ := net.ParseCIDR(fmt.Sprintf("10.244.%d.0/24", i+2))
		peers = append(peers, wgtypes.PeerConfig{PublicKey: k.PublicKey(), AllowedIPs: []net.IPNet{*ipnet},
			Endpoint: net.UDPAddrFromAddrPort(netip.MustParseAddrPort(fmt.Sprintf("127.0.0.1:%d", 52000+i)))})
	}
	if err := c.Set(ctx, wgtypes.Config{PrivateKey: &priv, Peers: peers}); err != nil {
		t.Fatal(err)
	}
	g1, err := c.Generation(ctx)
	if err != nil {
		t.Fatal(err)
	}
	unknown, _ := wgtypes.GeneratePrivateKey()
	got, err := c.Peers(ctx, []wgtypes.Key{keys[2], unknown.PublicKey(), keys[0]})
	if err != nil {
		t.Fatal(err)
	}
	var seen []string
	for _, p := range got {
		seen = append(seen, p.Endpoint.String()+" "+p.AllowedIPs[0].String())
	}
	slices.Sort(seen)
	if want := []string{"127.0.0.1:52000 10.244.2.0/24", "127.0.0.1:52002 10.244.4.0/24"}; !slices.Equal(seen, want) {
		t.Fatalf("peers query answered %v, want %v", seen, want)
	}
	if g2, err := c.Generation(ctx); err != nil || g2 != g1 {
		t.Fatalf("a peers query moved the generation: %d -> %d (%v)", g1, g2, err)
	}
	if v, err := c.Version(ctx); err != nil || v != Version {
		t.Fatalf("twill-wg's version: %d (%v), want %d", v, err, Version)
	}
	if g3, err := c.Generation(ctx); err != nil || g3 != g1 {
		t.Fatalf("a version query moved the generation: %d -> %d (%v)", g1, g3, err)
	}
	raw := func(req string) string {
		conn, err := net.Dial("unix", sock)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
		if _, err := io.WriteString(conn, req); err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(conn)
		return string(b)
	}
	if out := raw("twill_peers=1\npublic_key=" + hex.EncodeToString(keys[1][:]) + "\n\n"); strings.Contains(out, "private_key") || !strings.HasSuffix(out, "errno=0\n\n") {
		t.Fatalf("peers query answered %q: want the peer alone, no device fields", out)
	}
	if out := raw("twill_peers=1\nprivate_key=00\n\n"); out != "errno=22\n\n" {
		t.Fatalf("a malformed peers query answered %q, want errno=22", out)
	}

	// wireguard-go's own socket: it closes the connection on a query it
	// does not know.
	plain := filepath.Join(dir, "plain.sock")
	l, err := net.Listen("unix", plain)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	dev := device.NewDevice(tuntest.NewChannelTUN().TUN(), &DiscardBind{}, device.NewLogger(device.LogLevelSilent, ""))
	defer dev.Close()
	go func() {
		for {
			conn, err := l.Accept()
			if err != nil {
				return
			}
			go dev.IpcHandle(conn)
		}
	}()
	// Many keys: wireguard-go closes with some of them unread, which the
	// kernel reports as a reset rather than an end.
	many := slices.Clone(keys)
	for range 300 {
		k, _ := wgtypes.GeneratePrivateKey()
		many = append(many, k.PublicKey())
	}
	for _, ks := range [][]wgtypes.Key{keys, many} {
		if _, err := (&uapi.Client{Path: plain}).Peers(ctx, ks); !errors.Is(err, uapi.ErrNoPeersQuery) {
			t.Fatalf("wireguard-go's socket, %d keys: %v, want ErrNoPeersQuery", len(ks), err)
		}
	}
	// Nor does it know the version query: version 0, get and set only (as
	// a twill-wg from before the query, which hands it to wireguard-go).
	if v, err := (&uapi.Client{Path: plain}).Version(ctx); err != nil || v != 0 {
		t.Fatalf("wireguard-go's socket: version %d (%v), want 0 and no error", v, err)
	}
}
