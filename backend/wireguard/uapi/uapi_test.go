package uapi

import (
	"bufio"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
)

func key(t testing.TB, b byte) wgtypes.Key {
	t.Helper()
	var k wgtypes.Key
	for i := range k {
		k[i] = b
	}
	return k
}

func TestEncodeSet(t *testing.T) {
	priv, pub, psk := key(t, 1), key(t, 2), key(t, 3)
	port, ka := 51820, 25*time.Second
	got := EncodeSet(wgtypes.Config{PrivateKey: &priv, ListenPort: &port, Peers: []wgtypes.PeerConfig{
		{PublicKey: pub, Endpoint: net.UDPAddrFromAddrPort(netip.MustParseAddrPort("10.0.0.2:51820")), PresharedKey: &psk,
			PersistentKeepaliveInterval: &ka, ReplaceAllowedIPs: true, AllowedIPs: []net.IPNet{{IP: net.IPv4(10, 244, 1, 0).To4(), Mask: net.CIDRMask(24, 32)}}},
		{PublicKey: psk, Remove: true},
	}})
	want := "set=1\nprivate_key=" + strings.Repeat("01", 32) + "\nlisten_port=51820\npublic_key=" + strings.Repeat("02", 32) +
		"\npreshared_key=" + strings.Repeat("03", 32) + "\nendpoint=10.0.0.2:51820\npersistent_keepalive_interval=25\nreplace_allowed_ips=true\nallowed_ip=10.244.1.0/24\n" +
		"public_key=" + strings.Repeat("03", 32) + "\nremove=true\n\n"
	if got != want {
		t.Fatalf("got\n%s\nwant\n%s", got, want)
	}
}

func TestParseGet(t *testing.T) {
	reply := "private_key=" + strings.Repeat("01", 32) + "\nlisten_port=51820\nfwmark=0\n" +
		"public_key=" + strings.Repeat("02", 32) + "\npreshared_key=" + strings.Repeat("00", 32) +
		"\nprotocol_version=1\nendpoint=[fd00::2]:51821\nlast_handshake_time_sec=1700000000\nlast_handshake_time_nsec=5\ntx_bytes=10\nrx_bytes=20\n" +
		"persistent_keepalive_interval=0\nallowed_ip=10.244.1.0/24\nallowed_ip=fd10::/64\nerrno=0\n\n"
	d, err := ParseGet(bufio.NewReader(strings.NewReader(reply)))
	if err != nil {
		t.Fatal(err)
	}
	if d.PrivateKey != key(t, 1) || d.PublicKey != key(t, 1).PublicKey() || d.ListenPort != 51820 || len(d.Peers) != 1 {
		t.Fatalf("device %+v", d)
	}
	p := d.Peers[0]
	if p.PublicKey != key(t, 2) || p.Endpoint.String() != "[fd00::2]:51821" || len(p.AllowedIPs) != 2 ||
		p.AllowedIPs[0].String() != "10.244.1.0/24" || p.AllowedIPs[1].String() != "fd10::/64" || p.ReceiveBytes != 20 || p.TransmitBytes != 10 {
		t.Fatalf("peer %+v", p)
	}
	// The handshake's time to the nanosecond, whichever part comes
	// first: twilld compares it with the moment it changed the device.
	if want := time.Unix(1700000000, 5); !p.LastHandshakeTime.Equal(want) {
		t.Fatalf("last handshake %s, want %s", p.LastHandshakeTime, want)
	}
	swapped := strings.Replace(reply, "last_handshake_time_sec=1700000000\nlast_handshake_time_nsec=5", "last_handshake_time_nsec=5\nlast_handshake_time_sec=1700000000", 1)
	if d, err := ParseGet(bufio.NewReader(strings.NewReader(swapped))); err != nil || !d.Peers[0].LastHandshakeTime.Equal(time.Unix(1700000000, 5)) {
		t.Fatalf("nsec before sec: %v, %v", d, err)
	}
}

func TestParseGetRejects(t *testing.T) {
	for _, reply := range []string{
		"listen_port=99999\nerrno=0\n\n",
		"public_key=zz\nerrno=0\n\n",
		"public_key=" + strings.Repeat("02", 32) + "\nendpoint=nowhere\nerrno=0\n\n",
		"public_key=" + strings.Repeat("02", 32) + "\nallowed_ip=10.0.0.0/99\nerrno=0\n\n",
		"garbage\n\n",
		"errno=1\n\n",
		"private_key=" + strings.Repeat("01", 32) + "\n", // no blank line
	} {
		if d, err := ParseGet(bufio.NewReader(strings.NewReader(reply))); err == nil {
			t.Errorf("%q: parsed as %+v", reply, d)
		}
	}
}

// FuzzParseGet: whatever a device (or something posing as one) answers,
// the parser returns an error or a device, and never panics; a parsed
// device encodes to a request that parses back to the same peers.
func FuzzParseGet(f *testing.F) {
	f.Add("private_key=" + strings.Repeat("01", 32) + "\nlisten_port=1\npublic_key=" + strings.Repeat("02", 32) + "\nendpoint=1.2.3.4:5\nallowed_ip=10.0.0.0/8\nerrno=0\n\n")
	f.Add("errno=0\n\n")
	f.Fuzz(func(t *testing.T, reply string) {
		d, err := ParseGet(bufio.NewReader(strings.NewReader(reply)))
		if err != nil {
			return
		}
		var cfg wgtypes.Config
		for _, p := range d.Peers {
			cfg.Peers = append(cfg.Peers, wgtypes.PeerConfig{PublicKey: p.PublicKey, AllowedIPs: p.AllowedIPs, ReplaceAllowedIPs: true})
		}
		req := EncodeSet(cfg)
		// The request's body is what a get reply lists, minus the verb.
		back, err := ParseGet(bufio.NewReader(strings.NewReader(strings.TrimSuffix(strings.ReplaceAll(strings.TrimPrefix(req, "set=1\n"), "replace_allowed_ips=true\n", ""), "\n") + "errno=0\n\n")))
		if err != nil {
			t.Fatalf("re-parsing %q: %v", req, err)
		}
		if len(back.Peers) != len(d.Peers) {
			t.Fatalf("%d peers, then %d", len(d.Peers), len(back.Peers))
		}
	})
}
