// Package uapi speaks WireGuard's cross-platform userspace API, the text
// protocol a userspace device (wireguard-go, twill-wg) serves on a unix
// socket: "get=1" reads the device's configuration, "set=1" changes it.
// wgctrl speaks it too, but only to sockets under /var/run/wireguard;
// twill keeps each node's socket in its own state directory, so that
// nodes sharing a machine (the lab) and a restarted twilld find theirs.
package uapi

import (
	"bufio"
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
)

// Client talks to the device whose socket is at Path.
type Client struct {
	Path string
	// Timeout bounds one exchange (default 5s).
	Timeout time.Duration
}

// ErrNoDevice is returned (wrapped) when nothing listens on the socket.
var ErrNoDevice = errors.New("no userspace WireGuard device listens there")

func (c *Client) dial(ctx context.Context) (net.Conn, error) {
	t := c.Timeout
	if t == 0 {
		t = 5 * time.Second
	}
	ctx, cancel := context.WithTimeout(ctx, t)
	defer cancel()
	var d net.Dialer
	conn, err := d.DialContext(ctx, "unix", c.Path)
	if err != nil {
		return nil, fmt.Errorf("connecting to %s: %w: %w", c.Path, ErrNoDevice, err)
	}
	_ = conn.SetDeadline(time.Now().Add(t))
	return conn, nil
}

// Get reads the device's configuration.
func (c *Client) Get(ctx context.Context) (*wgtypes.Device, error) {
	conn, err := c.dial(ctx)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	if _, err := io.WriteString(conn, "get=1\n\n"); err != nil {
		return nil, fmt.Errorf("reading device %s: %w", c.Path, err)
	}
	d, err := ParseGet(bufio.NewReader(conn))
	if err != nil {
		return nil, fmt.Errorf("reading device %s: %w", c.Path, err)
	}
	return d, nil
}

// Peers reads the peers with the given keys (those the device has) from
// a twill-wg device (see userspace.PeersQuery), without its device
// fields. Other devices close the connection unanswered: that is
// ErrNoPeersQuery.
func (c *Client) Peers(ctx context.Context, keys []wgtypes.Key) ([]wgtypes.Peer, error) {
	conn, err := c.dial(ctx)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	var req strings.Builder
	req.WriteString("twill_peers=1\n")
	for _, k := range keys {
		req.WriteString("public_key=" + hex.EncodeToString(k[:]) + "\n")
	}
	req.WriteString("\n")
	// A device that does not know the query closes the connection without
	// a word.
	if _, err := io.WriteString(conn, req.String()); err != nil {
		if closedUnanswered(err) {
			err = ErrNoPeersQuery
		}
		return nil, fmt.Errorf("reading peers of %s: %w", c.Path, err)
	}
	br := bufio.NewReader(conn)
	if _, err := br.Peek(1); closedUnanswered(err) {
		return nil, fmt.Errorf("reading peers of %s: %w", c.Path, ErrNoPeersQuery)
	}
	d, err := ParseGet(br)
	if err != nil {
		return nil, fmt.Errorf("reading peers of %s: %w", c.Path, err)
	}
	return d.Peers, nil
}

// ErrNoPeersQuery is returned (wrapped) by a device that does not answer
// Peers: wireguard-go itself, or a twill-wg from before the query.
var ErrNoPeersQuery = errors.New("the device does not answer a peers query")

// Generation asks a twill-wg device how many times its configuration may
// have changed (see userspace.GenerationQuery); other devices answer with
// an error.
func (c *Client) Generation(ctx context.Context) (uint64, error) {
	conn, err := c.dial(ctx)
	if err != nil {
		return 0, err
	}
	defer conn.Close()
	if _, err := io.WriteString(conn, "twill_generation=1\n\n"); err != nil {
		return 0, err
	}
	kv, err := readReply(bufio.NewReader(conn))
	if err != nil {
		return 0, fmt.Errorf("reading %s's generation: %w", c.Path, err)
	}
	v, found := kv["generation"]
	if !found {
		return 0, fmt.Errorf("%s does not tell its generation", c.Path)
	}
	gen, err := strconv.ParseUint(v, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("reading %s's generation: %q", c.Path, "generation="+v)
	}
	return gen, nil
}

// readReply reads a short reply of key=value lines (at most 8), up to the
// blank line that ends it.
func readReply(r *bufio.Reader) (map[string]string, error) {
	kv := map[string]string{}
	for n := 0; n < 8; n++ {
		line, err := r.ReadString('\n')
		if err != nil {
			return nil, err
		}
		line = strings.TrimSuffix(line, "\n")
		if line == "" {
			break
		}
		k, v, _ := strings.Cut(line, "=")
		kv[k] = v
	}
	return kv, nil
}

// Version asks a device which version of twill-wg's extensions to the
// userspace API it serves (see userspace.VersionQuery): 0 when it closes
// the connection unanswered, as wireguard-go itself and a twill-wg from
// before the version query do.
func (c *Client) Version(ctx context.Context) (int, error) {
	conn, err := c.dial(ctx)
	if err != nil {
		return 0, err
	}
	defer conn.Close()
	if _, err := io.WriteString(conn, "twill_version=1\n\n"); err != nil {
		if closedUnanswered(err) {
			return 0, nil
		}
		return 0, fmt.Errorf("asking %s's version: %w", c.Path, err)
	}
	r := bufio.NewReader(conn)
	if _, err := r.Peek(1); closedUnanswered(err) {
		return 0, nil
	}
	kv, err := readReply(r)
	if err != nil {
		return 0, fmt.Errorf("asking %s's version: %w", c.Path, err)
	}
	version, errno := -1, -1
	for k, dst := range map[string]*int{"twill_version": &version, "errno": &errno} {
		if v, ok := kv[k]; ok {
			if *dst, err = strconv.Atoi(v); err != nil {
				return 0, fmt.Errorf("asking %s's version: reply %q", c.Path, k+"="+v)
			}
		}
	}
	if errno != 0 || version < 1 {
		return 0, fmt.Errorf("asking %s's version: no version in the reply (errno %d)", c.Path, errno)
	}
	return version, nil
}

// closedUnanswered reports whether err is a device closing the connection
// without a word: an end, or a reset when it left some of the request
// unread (a broken pipe if that was before all of it was written).
func closedUnanswered(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)
}

// Set applies cfg. The device applies a set in one transaction.
func (c *Client) Set(ctx context.Context, cfg wgtypes.Config) error {
	conn, err := c.dial(ctx)
	if err != nil {
		return err
	}
	defer conn.Close()
	if _, err := io.WriteString(conn, EncodeSet(cfg)); err != nil {
		return fmt.Errorf("configuring device %s: %w", c.Path, err)
	}
	r := bufio.NewReader(conn)
	errno := -1
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			return fmt.Errorf("configuring device %s: reading the reply: %w", c.Path, err)
		}
		line = strings.TrimSuffix(line, "\n")
		if line == "" {
			break
		}
		if v, ok := strings.CutPrefix(line, "errno="); ok {
			if errno, err = strconv.Atoi(v); err != nil {
				return fmt.Errorf("configuring device %s: reply %q", c.Path, line)
			}
		}
	}
	if errno != 0 {
		return fmt.Errorf("configuring device %s: the device refused the change (errno %d)", c.Path, errno)
	}
	return nil
}

// EncodeSet is the "set=1" request for cfg, ending with the blank line.
func EncodeSet(cfg wgtypes.Config) string {
	var b strings.Builder
	b.WriteString("set=1\n")
	kv := func(k, v string) { b.WriteString(k + "=" + v + "\n") }
	if cfg.PrivateKey != nil {
		kv("private_key", hex.EncodeToString(cfg.PrivateKey[:]))
	}
	if cfg.ListenPort != nil {
		kv("listen_port", strconv.Itoa(*cfg.ListenPort))
	}
	if cfg.FirewallMark != nil {
		kv("fwmark", strconv.Itoa(*cfg.FirewallMark))
	}
	if cfg.ReplacePeers {
		kv("replace_peers", "true")
	}
	for _, p := range cfg.Peers {
		kv("public_key", hex.EncodeToString(p.PublicKey[:]))
		if p.Remove {
			kv("remove", "true")
			continue
		}
		if p.UpdateOnly {
			kv("update_only", "true")
		}
		if p.PresharedKey != nil {
			kv("preshared_key", hex.EncodeToString(p.PresharedKey[:]))
		}
		if p.Endpoint != nil {
			kv("endpoint", p.Endpoint.String())
		}
		if p.PersistentKeepaliveInterval != nil {
			kv("persistent_keepalive_interval", strconv.Itoa(int(p.PersistentKeepaliveInterval.Seconds())))
		}
		if p.ReplaceAllowedIPs {
			kv("replace_allowed_ips", "true")
		}
		for _, ip := range p.AllowedIPs {
			kv("allowed_ip", ip.String())
		}
	}
	b.WriteString("\n")
	return b.String()
}

// maxLines bounds a reply: a device with 100,000 peers and a few allowed
// IPs each stays well below it.
const maxLines = 4 << 20

// ParseGet reads a "get=1" reply up to its blank line. It rejects lines it
// cannot read and a nonzero errno, naming the line.
func ParseGet(r *bufio.Reader) (*wgtypes.Device, error) {
	d := &wgtypes.Device{Type: wgtypes.Userspace}
	var peer *wgtypes.Peer
	errno := -1
	for n := 0; ; n++ {
		if n > maxLines {
			return nil, fmt.Errorf("reply longer than %d lines", maxLines)
		}
		line, err := r.ReadString('\n')
		if err != nil {
			return nil, fmt.Errorf("reply ended before its blank line: %w", err)
		}
		line = strings.TrimSuffix(line, "\n")
		if line == "" {
			break
		}
		k, v, ok := strings.Cut(line, "=")
		if !ok {
			return nil, fmt.Errorf("reply line %q: not key=value", line)
		}
		if k == "public_key" {
			key, err := parseKey(v)
			if err != nil {
				return nil, fmt.Errorf("reply line %q: %w", line, err)
			}
			d.Peers = append(d.Peers, wgtypes.Peer{PublicKey: key})
			peer = &d.Peers[len(d.Peers)-1]
			continue
		}
		if k == "errno" {
			if errno, err = strconv.Atoi(v); err != nil {
				return nil, fmt.Errorf("reply line %q: %w", line, err)
			}
			continue
		}
		if peer == nil {
			err = deviceField(d, k, v)
		} else {
			err = peerField(peer, k, v)
		}
		if err != nil {
			return nil, fmt.Errorf("reply line %q: %w", line, err)
		}
	}
	if errno != 0 {
		return nil, fmt.Errorf("the device answered errno %d", errno)
	}
	return d, nil
}

func deviceField(d *wgtypes.Device, k, v string) error {
	var err error
	switch k {
	case "private_key":
		if d.PrivateKey, err = parseKey(v); err == nil {
			d.PublicKey = d.PrivateKey.PublicKey()
		}
	case "listen_port":
		var p uint64
		p, err = strconv.ParseUint(v, 10, 16)
		d.ListenPort = int(p)
	case "fwmark":
		var m uint64
		m, err = strconv.ParseUint(v, 10, 32)
		d.FirewallMark = int(m)
	}
	return err // other keys are ignored: newer devices may add some
}

func peerField(p *wgtypes.Peer, k, v string) error {
	var err error
	switch k {
	case "preshared_key":
		p.PresharedKey, err = parseKey(v)
	case "endpoint":
		var ap netip.AddrPort
		if ap, err = netip.ParseAddrPort(v); err == nil {
			p.Endpoint = net.UDPAddrFromAddrPort(ap)
		}
	case "persistent_keepalive_interval":
		var s uint64
		s, err = strconv.ParseUint(v, 10, 16)
		p.PersistentKeepaliveInterval = time.Duration(s) * time.Second
	case "allowed_ip":
		var pf netip.Prefix
		if pf, err = netip.ParsePrefix(v); err == nil {
			p.AllowedIPs = append(p.AllowedIPs, net.IPNet{IP: pf.Addr().AsSlice(), Mask: net.CIDRMask(pf.Bits(), pf.Addr().BitLen())})
		}
	case "last_handshake_time_sec", "last_handshake_time_nsec":
		// Either may come first; a time of 0 (no handshake) stays zero.
		var x int64
		if x, err = strconv.ParseInt(v, 10, 64); err == nil && x != 0 {
			sec, nsec := int64(0), int64(0)
			if !p.LastHandshakeTime.IsZero() {
				sec, nsec = p.LastHandshakeTime.Unix(), int64(p.LastHandshakeTime.Nanosecond())
			}
			if k == "last_handshake_time_sec" {
				sec = x
			} else {
				nsec = x
			}
			p.LastHandshakeTime = time.Unix(sec, nsec)
		}
	case "rx_bytes":
		p.ReceiveBytes, err = strconv.ParseInt(v, 10, 64)
	case "tx_bytes":
		p.TransmitBytes, err = strconv.ParseInt(v, 10, 64)
	case "protocol_version":
		p.ProtocolVersion, err = strconv.Atoi(v)
	}
	return err
}

func parseKey(v string) (wgtypes.Key, error) {
	b, err := hex.DecodeString(v)
	if err != nil || len(b) != wgtypes.KeyLen {
		return wgtypes.Key{}, fmt.Errorf("a key is %d bytes in hex, not %q", wgtypes.KeyLen, v)
	}
	return wgtypes.Key(b), nil
}
