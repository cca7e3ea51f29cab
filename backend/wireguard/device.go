package wireguard

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.zx2c4.com/wireguard/wgctrl"
	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"

	"github.com/twill-net/twill/backend"
	"github.com/twill-net/twill/backend/wireguard/uapi"
	"github.com/twill-net/twill/backend/wireguard/wgkeeper"
	"github.com/twill-net/twill/nl"
)

// Device is the seam to one WireGuard device's configuration, kernel or
// userspace alike.
type Device interface {
	Get(ctx context.Context) (*wgtypes.Device, error)
	Set(ctx context.Context, cfg wgtypes.Config) error
	// Extensions says what the device answers beyond get and set, as it
	// does now: a twill-wg updated under a running twilld is used in full
	// from the next operation on.
	Extensions(ctx context.Context) Extensions
}

// Extensions are the queries a device answers beyond the userspace API's
// get and set (twill-wg's, by the version it serves: see
// userspace.Version). A nil field is a query the device does not answer.
type Extensions struct {
	// Generation tells how many times the device may have changed
	// (userspace.GenerationQuery).
	Generation func(ctx context.Context) (uint64, error)
	// Peers reads the peers with the given keys, without the others
	// (userspace.PeersQuery).
	Peers func(ctx context.Context, keys []wgtypes.Key) ([]wgtypes.Peer, error)
}

// Links is what the backend needs of netlink: its devices, their
// addresses, and the routes through them. *nl.Handle has it.
type Links interface {
	backend.RouteTable
	backend.RouteWatcher
	LinkByName(name string) (nl.Link, error)
	LinkDel(index int) error
	LinkSetUp(index int) error
	LinkSetMTU(index, mtu int) error
	Addrs(link int, family nl.Family) ([]nl.Addr, error)
	AddrAdd(link int, p netip.Prefix) error
	AddrDel(link int, p netip.Prefix) error
	WireGuardAdd(name string, mtu int) (nl.Link, error)
}

var _ Links = (*nl.Handle)(nil)

// Implementations of a device, as status and metrics name them.
const (
	ImplKernel    = "kernel"
	ImplUserspace = "userspace"
)

// devices creates, finds and opens the backend's devices.
type devices struct {
	k        Links
	log      *slog.Logger
	stateDir string
	helper   string // the twill-wg binary
	// opener opens a device's configuration (tests: a fake device).
	opener func(name, impl string) (Device, error)

	info *prometheus.GaugeVec // twill_wireguard_device_info; nil records nothing

	mu   sync.Mutex
	impl map[string]string // guarded by mu: device name -> ImplKernel/ImplUserspace
	wgc  *wgctrl.Client    // guarded by mu: opened on first kernel use
}

func newDevices(opts backend.Options, log *slog.Logger) *devices {
	d := &devices{k: opts.Netlink, log: log, stateDir: opts.StateDir, helper: helperPath(), impl: map[string]string{}}
	if opts.Metrics != nil && opts.Metrics.Registerer != nil {
		d.info = prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "twill_wireguard_device_info",
			Help: "1 for each WireGuard device, labelled with its implementation: kernel, or userspace (twill-wg)"}, []string{"device", "implementation"})
		if err := opts.Metrics.Registerer.Register(d.info); err != nil {
			var are prometheus.AlreadyRegisteredError
			if errors.As(err, &are) {
				d.info = are.ExistingCollector.(*prometheus.GaugeVec)
			}
		}
	}
	return d
}

// helperPath is twill-wg beside the running binary, else on PATH.
func helperPath() string {
	if exe, err := os.Executable(); err == nil {
		p := filepath.Join(filepath.Dir(exe), "twill-wg")
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	if p, err := exec.LookPath("twill-wg"); err == nil {
		return p
	}
	return "twill-wg"
}

// Socket is where a userspace device's API is served: the state directory
// (or /var/run/twill without one).
func Socket(stateDir, name string) string {
	if stateDir == "" {
		stateDir = "/var/run/twill"
	}
	return filepath.Join(stateDir, name+".sock")
}

// KeeperSocket is where a twill-wg keeper serves device requests: when
// one answers there, twilld asks it for its userspace devices rather than
// starting twill-wg itself (Kubernetes: the kube-twill-wireguard
// DaemonSet, which outlives twilld's pods).
func KeeperSocket(stateDir string) string { return Socket(stateDir, "twill-wg-keeper") }

// PIDFile is where twill-wg records its PID.
func PIDFile(stateDir, name string) string { return Socket(stateDir, name) + ".pid" }

// Impl says how the named device is implemented: as this process set it
// up, else as the link's type tells ("" when there is no such link).
func (d *devices) Impl(name string) string {
	d.mu.Lock()
	impl := d.impl[name]
	d.mu.Unlock()
	if impl != "" || d.k == nil {
		return impl
	}
	link, err := d.k.LinkByName(name)
	switch {
	case err != nil:
		return ""
	case link.Type == "wireguard":
		return ImplKernel
	}
	return ImplUserspace
}

// ensure makes tunnel t's device exist, with its MTU, addrs and up, and
// returns it with its link.
func (d *devices) ensure(ctx context.Context, t tunnel, addrs []netip.Prefix) (Device, nl.Link, error) {
	if d.k == nil {
		return nil, nl.Link{}, errors.New("wireguard: this netlink handle cannot create WireGuard devices")
	}
	link, err := d.k.LinkByName(t.name)
	switch {
	case errors.Is(err, nl.ErrLinkNotFound):
		if link, err = d.create(ctx, t); err != nil {
			return nil, nl.Link{}, err
		}
	case err != nil:
		return nil, nl.Link{}, err
	case link.Type != "wireguard" && !d.answers(ctx, t):
		// A TUN device whose twill-wg is gone (or someone else's
		// device of our name): twill's device is made anew.
		d.log.Warn("replacing a device nothing serves", "device", t.name, "type", link.Type)
		if err := d.k.LinkDel(link.Index); err != nil && !errors.Is(err, nl.ErrLinkNotFound) {
			return nil, nl.Link{}, err
		}
		if link, err = d.create(ctx, t); err != nil {
			return nil, nl.Link{}, err
		}
	}
	impl := ImplUserspace
	if link.Type == "wireguard" {
		impl = ImplKernel
	}
	d.setImpl(t.name, impl)
	if link.MTU != t.mtu {
		if err := d.k.LinkSetMTU(link.Index, t.mtu); err != nil {
			return nil, nl.Link{}, err
		}
	}
	if err := d.addrs(link, addrs); err != nil {
		return nil, nl.Link{}, err
	}
	if !link.Up {
		if err := d.k.LinkSetUp(link.Index); err != nil {
			return nil, nl.Link{}, err
		}
	}
	dev, err := d.open(t.name, impl)
	return dev, link, err
}

func (d *devices) setImpl(name, impl string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.impl[name] != impl {
		d.impl[name] = impl
		d.log.Info("using "+impl+" WireGuard", "device", name)
		if d.info != nil {
			d.info.DeletePartialMatch(prometheus.Labels{"device": name})
			d.info.WithLabelValues(name, impl).Set(1)
		}
	}
}

func (d *devices) addrs(link nl.Link, want []netip.Prefix) error {
	if len(want) == 0 {
		return nil
	}
	return nl.SyncAddrs(d.k, link.Index, want)
}

// create makes the device: the kernel's if it has the module, else a
// twill-wg process's.
func (d *devices) create(ctx context.Context, t tunnel) (nl.Link, error) {
	link, err := d.k.WireGuardAdd(t.name, t.mtu)
	if err == nil {
		return link, nil
	}
	if !errors.Is(err, nl.ErrNotSupported) {
		return nl.Link{}, err
	}
	if keeper := KeeperSocket(d.stateDir); wgkeeper.Answers(keeper) {
		req := wgkeeper.Request{Name: t.name, Socket: Socket(d.stateDir, t.name), MTU: t.mtu}
		if err := wgkeeper.Ask(ctx, keeper, req); err != nil {
			return nl.Link{}, fmt.Errorf("wireguard: this kernel has no wireguard module, and the keeper failed: %w", err)
		}
		d.log.Info("this kernel has no wireguard module; the keeper runs a userspace device", "device", t.name, "keeper", keeper)
	} else if err := d.spawn(t); err != nil {
		return nl.Link{}, err
	}
	// Bounded: twill-wg creates the TUN device, then serves its socket.
	deadline := time.Now().Add(10 * time.Second)
	for {
		link, err := d.k.LinkByName(t.name)
		if err == nil && d.answers(ctx, t) {
			return link, nil
		}
		if time.Now().After(deadline) {
			return nl.Link{}, fmt.Errorf("wireguard: the userspace device %s did not come up within 10s (see %s)", t.name, d.helperLog(t))
		}
		select {
		case <-ctx.Done():
			return nl.Link{}, ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

func (d *devices) helperLog(t tunnel) string { return Socket(d.stateDir, t.name) + ".log" }

// spawn starts twill-wg for t in a session of its own, so that it
// outlives this twilld: the device, and pod traffic, do not depend on it.
func (d *devices) spawn(t tunnel) error {
	sock := Socket(d.stateDir, t.name)
	if err := os.MkdirAll(filepath.Dir(sock), 0o700); err != nil {
		return fmt.Errorf("wireguard: %w", err)
	}
	logf, err := os.OpenFile(d.helperLog(t), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return fmt.Errorf("wireguard: %w", err)
	}
	defer logf.Close()
	cmd := exec.Command(d.helper, "--name", t.name, "--socket", sock, "--pid-file", PIDFile(d.stateDir, t.name), "--mtu", strconv.Itoa(t.mtu))
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("wireguard: this kernel has no wireguard module, and starting the userspace device failed: %w", err)
	}
	go func() { _ = cmd.Wait() }() // reap it should it stop while twilld runs
	d.log.Info("this kernel has no wireguard module; started a userspace device", "device", t.name, "pid", cmd.Process.Pid, "socket", sock)
	return nil
}

// answers reports whether t's userspace device serves its socket: asked
// for its generation (cheap), else for its configuration.
func (d *devices) answers(ctx context.Context, t tunnel) bool {
	c := &uapi.Client{Path: Socket(d.stateDir, t.name), Timeout: 2 * time.Second}
	if _, err := c.Generation(ctx); err == nil {
		return true
	}
	_, err := c.Get(ctx)
	return err == nil
}

// open returns the configuration seam for a device.
func (d *devices) open(name, impl string) (Device, error) {
	if d.opener != nil {
		return d.opener(name, impl)
	}
	if impl == ImplUserspace {
		return userspaceDevice{c: &uapi.Client{Path: Socket(d.stateDir, name)}}, nil
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.wgc == nil {
		c, err := wgctrl.New()
		if err != nil {
			return nil, fmt.Errorf("wireguard: opening generic netlink: %w", err)
		}
		d.wgc = c
	}
	return kernelDevice{c: d.wgc, name: name}, nil
}

type userspaceDevice struct{ c *uapi.Client }

func (u userspaceDevice) Get(ctx context.Context) (*wgtypes.Device, error) { return u.c.Get(ctx) }

// Extensions asks twill-wg which version of its extensions it serves
// (version 0, none: a twill-wg from before the version query, or
// wireguard-go itself).
func (u userspaceDevice) Extensions(ctx context.Context) Extensions {
	if v, err := u.c.Version(ctx); err != nil || v < 1 {
		return Extensions{}
	}
	return Extensions{Generation: u.c.Generation, Peers: u.c.Peers}
}

// generation is dev's count of changes, or 0 when it cannot tell.
func generation(ctx context.Context, dev Device) uint64 {
	g := dev.Extensions(ctx).Generation
	if g == nil {
		return 0
	}
	n, err := g(ctx)
	if err != nil {
		return 0
	}
	return n
}
func (u userspaceDevice) Set(ctx context.Context, cfg wgtypes.Config) error {
	return u.c.Set(ctx, cfg)
}

type kernelDevice struct {
	c    *wgctrl.Client
	name string
}

// Extensions: the kernel's device answers generic netlink, none of
// twill-wg's queries.
func (k kernelDevice) Extensions(context.Context) Extensions { return Extensions{} }

func (k kernelDevice) Get(context.Context) (*wgtypes.Device, error) {
	d, err := k.c.Device(k.name)
	if err != nil {
		return nil, fmt.Errorf("reading device %s: %w", k.name, err)
	}
	return d, nil
}

func (k kernelDevice) Set(_ context.Context, cfg wgtypes.Config) error {
	if err := k.c.ConfigureDevice(k.name, cfg); err != nil {
		return fmt.Errorf("configuring device %s: %w", k.name, err)
	}
	return nil
}
