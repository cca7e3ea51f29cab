// Package userspace runs a WireGuard device in a process of its own, for
// kernels without the wireguard module: a TUN device driven by
// wireguard-go, configured through the userspace API on a unix socket.
//
// It is a process apart from twilld (cmd/twill-wg) so that pod traffic
// does not depend on twilld: twilld restarts, upgrades and crashes leave
// the device, its keys, its sessions and its peers as they were, and the
// twilld that comes back finds the device through its socket and carries
// on reconciling it. The device lives until the process is told to stop,
// or until its TUN device is deleted (the link removed by hand, its
// network namespace gone), which wireguard-go notices and stops on.
package userspace

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"

	"golang.zx2c4.com/wireguard/conn"
	"golang.zx2c4.com/wireguard/device"
	"golang.zx2c4.com/wireguard/tun"
)

// Options describe the device.
type Options struct {
	Logger *slog.Logger
	// Name is the TUN device's name.
	Name string
	// Socket is where the userspace API is served; PIDFile (optional)
	// records this process's PID beside it.
	Socket  string
	PIDFile string
	MTU     int
	// TUN, when set, is used instead of creating a TUN device named Name
	// (tests: an in-memory one).
	TUN tun.Device
	// Bind, when set, carries the encrypted packets instead of UDP
	// sockets (tests: DiscardBind).
	Bind conn.Bind
	// Verbose logs wireguard-go's own account of each handshake, keepalive
	// and peer change, at debug level (twill-wg --verbose).
	Verbose bool
}

// Run creates the device and serves it until ctx is done (the device is
// then deleted) or the device stops by itself.
func Run(ctx context.Context, o Options) error {
	if o.Name == "" || o.Socket == "" {
		return errors.New("userspace device: a name and a socket path are required")
	}
	if o.MTU == 0 {
		o.MTU = 1420
	}
	log := o.Logger.With("device", o.Name)
	if err := os.MkdirAll(filepath.Dir(o.Socket), 0o700); err != nil {
		return fmt.Errorf("creating the socket's directory: %w", err)
	}
	if c, err := net.Dial("unix", o.Socket); err == nil {
		c.Close()
		return fmt.Errorf("a device already serves %s", o.Socket)
	}
	_ = os.Remove(o.Socket) // a stale socket from a process that died
	t := o.TUN
	if t == nil {
		var err error
		if t, err = tun.CreateTUN(o.Name, o.MTU); err != nil {
			return fmt.Errorf("creating TUN device %s: %w", o.Name, err)
		}
	}
	bind := o.Bind
	if bind == nil {
		bind = conn.NewDefaultBind()
	}
	verbose := func(string, ...any) {}
	if o.Verbose {
		verbose = func(f string, a ...any) { log.Debug(fmt.Sprintf(f, a...)) }
	}
	dev := device.NewDevice(t, bind, &device.Logger{
		Verbosef: verbose,
		Errorf:   func(f string, a ...any) { log.Warn(fmt.Sprintf(f, a...)) },
	})
	defer dev.Close()
	l, err := net.Listen("unix", o.Socket)
	if err != nil {
		return fmt.Errorf("serving the userspace API on %s: %w", o.Socket, err)
	}
	defer l.Close()
	if err := os.Chmod(o.Socket, 0o600); err != nil {
		return fmt.Errorf("restricting %s: %w", o.Socket, err)
	}
	if o.PIDFile != "" {
		if err := os.WriteFile(o.PIDFile, []byte(strconv.Itoa(os.Getpid())+"\n"), 0o600); err != nil {
			return fmt.Errorf("writing %s: %w", o.PIDFile, err)
		}
		defer os.Remove(o.PIDFile)
	}
	var gen atomic.Uint64
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go serve(dev, c, &gen)
		}
	}()
	log.Info("userspace WireGuard device ready", "socket", o.Socket, "mtu", o.MTU)
	select {
	case <-ctx.Done():
		log.Info("stopping; the device is deleted")
	case <-dev.Wait():
		log.Info("the device was closed (its TUN device is gone); stopping")
	}
	return nil
}

// VersionQuery asks a twill-wg device which version of its extensions to
// the userspace API it serves: it answers "twill_version=<n>", then
// "errno=0" and a blank line. twilld asks at each operation on a device
// and uses what that version has, so that a twill-wg updated under a
// running twilld is used in full at once. A device that does not know
// the query (wireguard-go itself, a twill-wg before it) closes the
// connection unanswered: version 0, get and set only.
const VersionQuery = "twill_version=1\n"

// Version is the version of the extensions this twill-wg serves:
//
//	1: GenerationQuery and PeersQuery.
//
// A new extension comes with a new version; twilld uses an extension only
// from a device whose version has it.
const Version = 1

// GenerationQuery asks a twill-wg device how many times its configuration
// may have changed: it answers "generation=<n>", then "errno=0" and a
// blank line, as the userspace API's get does. twilld compares it with
// the generation after its own last change instead of reading every peer
// back to find hand-made changes (a poll every 2s of 5,000 peers cost
// 2.6% of a core).
const GenerationQuery = "twill_generation=1\n"

// PeersQuery asks a twill-wg device for some of its peers: the request
// goes on with one "public_key=<hex>" line per peer and a blank line, and
// the device answers as the userspace API's get does, with those of the
// peers it has and no device fields. twilld's follower of first
// handshakes asks for the peers it follows: a get of every peer (20 ms at
// 5,000) held back the lease events behind it, on twilld's side and on
// wireguard-go's, which holds its configuration lock while it writes a
// get's answer to the socket.
const PeersQuery = "twill_peers=1\n"

// maxPeersAsked bounds a peers query's key lines.
const maxPeersAsked = 1 << 16

// serve answers one connection: the generation and peers queries here,
// anything else by wireguard-go; whatever is not a get or a query counts
// as a change.
func serve(dev *device.Device, c net.Conn, gen *atomic.Uint64) {
	r := bufio.NewReader(c)
	line, err := r.ReadString('\n')
	if err != nil {
		c.Close()
		return
	}
	if line == VersionQuery {
		defer c.Close()
		fmt.Fprintf(c, "twill_version=%d\nerrno=0\n\n", Version)
		return
	}
	if line == GenerationQuery {
		defer c.Close()
		fmt.Fprintf(c, "generation=%d\nerrno=0\n\n", gen.Load())
		return
	}
	if line == PeersQuery {
		defer c.Close()
		servePeers(dev, r, c)
		return
	}
	if line != "get=1\n" {
		gen.Add(1)
	}
	dev.IpcHandle(&replayConn{Conn: c, r: io.MultiReader(strings.NewReader(line), r)})
}

// servePeers answers a peers query whose first line was read from r: the
// device's get, taken into memory (so that wireguard-go's lock is not held
// while the socket drains), with only the peers asked for. A malformed
// request is answered with errno=22 (EINVAL).
func servePeers(dev *device.Device, r *bufio.Reader, w io.Writer) {
	want := map[string]bool{}
	for n := 0; ; n++ {
		line, err := r.ReadString('\n')
		if err != nil {
			return
		}
		if line == "\n" {
			break
		}
		key, ok := strings.CutPrefix(strings.TrimSuffix(line, "\n"), "public_key=")
		if !ok || n >= maxPeersAsked {
			fmt.Fprint(w, "errno=22\n\n")
			return
		}
		want[key] = true
	}
	var all strings.Builder
	if err := dev.IpcGetOperation(&all); err != nil {
		fmt.Fprint(w, "errno=1\n\n")
		return
	}
	out := bufio.NewWriter(w)
	keep := false
	for line := range strings.Lines(all.String()) {
		if key, ok := strings.CutPrefix(line, "public_key="); ok {
			keep = want[strings.TrimSuffix(key, "\n")]
		}
		if keep {
			out.WriteString(line)
		}
	}
	out.WriteString("errno=0\n\n")
	out.Flush()
}

// replayConn is a connection whose first bytes were already read.
type replayConn struct {
	net.Conn
	r io.Reader
}

func (c *replayConn) Read(p []byte) (int, error) { return c.r.Read(p) }
