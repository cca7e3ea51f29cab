// Package daemon is twilld's engine: it reads the network configuration,
// builds the chosen backend, holds this node's lease, writes subnet.env,
// keeps the iptables chains, and runs the level-triggered loop that hands
// every snapshot of peer leases to the backend.
//
// Events only signal: the subnet manager stores the latest snapshot and
// pokes a buffered-1 channel, as do kernel watchers; one goroutine
// reconciles the full desired state, and a ticker repairs drift.
package daemon

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"golang.org/x/sync/errgroup"

	"github.com/twill-net/twill/backend"
	"github.com/twill-net/twill/internal/backoff"
	"github.com/twill-net/twill/internal/desiredfile"
	"github.com/twill-net/twill/network"
	"github.com/twill-net/twill/network/netfilter"
	"github.com/twill-net/twill/subnet"
)

// SubnetManager is what the daemon needs from a subnet manager.
type SubnetManager interface {
	// NetworkConfig returns the cluster's net-conf.json.
	NetworkConfig(ctx context.Context) (*subnet.Config, error)
	// AcquireLease obtains this node's lease; hint is the lease recorded in
	// an earlier subnet.env, if any.
	AcquireLease(ctx context.Context, cfg *subnet.Config, attrs subnet.LeaseAttrs, hint subnet.Lease) (subnet.Lease, error)
	// Run publishes the leases (the local one included), the whole set
	// first and then what changes, and keeps the local lease alive until
	// ctx is done.
	Run(ctx context.Context, publish func(subnet.Change)) error
}

// Monitor is implemented by subnet managers that follow their connection
// to the datastore (etcd): Monitor runs for the daemon's whole life, from
// before the configuration is read, and Connected feeds /readyz and
// twill_subnet_manager_connected.
type Monitor interface {
	Monitor(ctx context.Context) error
	Connected() (ok bool, why string)
}

// ConflictCounter is implemented by subnet managers that notice another
// client overwriting this node's own lease (etcd mode): how many times.
type ConflictCounter interface {
	OwnLeaseConflicts() uint64
}

// DataUpdater is implemented by subnet managers that can change the
// backend data of the node's lease after it was taken (a new vxlan VTEP
// MAC).
type DataUpdater interface {
	UpdateBackendData(ctx context.Context, data, v6Data json.RawMessage) error
}

// LeasePrefetcher is implemented by subnet managers that can start
// reading every lease before AcquireLease is called (the etcd one: one
// range read that then overlaps reading the configuration, choosing the
// interface and preparing the backend).
type LeasePrefetcher interface {
	PrefetchLeases(ctx context.Context)
}

// ReadyNotifier is implemented by subnet managers that publish the node's
// readiness (the Kubernetes one sets NetworkUnavailable=False). Ready is
// called once, after the first successful reconcile.
type ReadyNotifier interface {
	Ready(ctx context.Context) error
}

// Options configure the daemon. Logger, Registry, Subnets and Netlink are
// required.
type Options struct {
	Logger   *slog.Logger
	Registry *backend.Registry
	Subnets  SubnetManager
	Netlink  Kernel
	Iface    network.IfaceOptions

	SubnetFile string
	// KeyRotations asks the backend to replace its key pair (see
	// backend.Options).
	KeyRotations <-chan struct{}
	// CNIConflist, when set, is written to CNIConflistPath once the node
	// is ready (so the runtime starts pods only once they can be wired),
	// and kept there like subnet.env.
	CNIConflist     []byte
	CNIConflistPath string
	// Allocations, when Dir is set, is the plugin's allocation store
	// (<dataDir>/<network>): every Every, allocations whose pod is gone
	// are released (runtimes that never call CNI GC leave them behind).
	Allocations AllocationsOptions
	StateDir    string
	IPMasq      bool
	// Netfilter is the --netfilter mode (auto when empty).
	Netfilter      netfilter.Mode
	IPTablesResync time.Duration
	// Resync is the period of the full reconcile that repairs drift.
	Resync time.Duration
	// HealthAddr serves /healthz, /readyz and /metrics; empty disables.
	HealthAddr string
	// Ready, when set, is called once, just before the node first reports
	// ready (twilld collects start-up's garbage there: internal/gcpace).
	Ready func()
	// FlannelSubnetFile is flannel's subnet.env on a node switched from
	// flannel (takeover.DefaultSubnetFile when empty): what flannel left
	// is retired once twill has taken its place (package takeover).
	FlannelSubnetFile string
	// Policy, when set, enforces NetworkPolicy for the pods of the local
	// lease's subnets until ctx is done; it calls synced once its rules
	// are first in place. The node takes pods (its CNI conflist is
	// installed) only after that.
	Policy func(ctx context.Context, local []netip.Prefix, synced func()) error
	// Collectors are more metrics for /metrics (the policy's).
	Collectors []prometheus.Collector
	// Node sets up forwarding and the netfilter rules (node.go); nil is
	// this network namespace's, in the Netfilter mode.
	Node NodeNetwork
}

// Daemon is one twilld.
type Daemon struct {
	o       Options
	log     *slog.Logger
	metrics *metrics
	poke    chan struct{}

	ready atomic.Bool
	ext   extWatch
	// afterFirstReconcile is set before the loop starts and called by it.
	afterFirstReconcile func() error
	peers               *peerSet
	// fullDue asks the loop for a full reconcile (the kernel drifted).
	fullDue atomic.Bool
	// pendingData is backend data not yet published (loop goroutine).
	pendingData *[2]json.RawMessage
	heartbeat   atomic.Int64 // unix nanos of the reconcile loop's last turn
	started     time.Time    // when Run began, for the start-up timings in the log
}

// New returns a daemon; Run starts it.
func New(o Options) *Daemon {
	if o.Resync <= 0 {
		o.Resync = 30 * time.Second
	}
	if o.IPTablesResync <= 0 {
		o.IPTablesResync = 5 * time.Second
	}
	d := &Daemon{o: o, log: o.Logger, metrics: newMetrics(), poke: make(chan struct{}, 1), peers: newPeerSet(o.Logger)}
	d.metrics.reg.MustRegister(o.Collectors...)
	own, _ := o.Subnets.(ConflictCounter)
	d.metrics.conflicts(d.peers, own)
	return d
}

// Ready reports whether the daemon holds its lease, has its rules in place,
// has written subnet.env and has reconciled once.
func (d *Daemon) Ready() bool { return d.ready.Load() }

// Run blocks until ctx is done or the daemon fails. Stopping leaves the
// data plane as it is, so pods keep talking across a restart.
func (d *Daemon) Run(ctx context.Context) error {
	d.started = time.Now()
	g, ctx := errgroup.WithContext(ctx)
	d.heartbeat.Store(time.Now().UnixNano())
	if d.o.HealthAddr != "" {
		ln, err := net.Listen("tcp", d.o.HealthAddr)
		if err != nil {
			return fmt.Errorf("listening on --healthz-ip/--healthz-port %s: %w", d.o.HealthAddr, err)
		}
		g.Go(func() error { return d.serveHealth(ctx, ln) })
	}
	if m, ok := d.o.Subnets.(Monitor); ok {
		d.metrics.connected(m)
		g.Go(func() error { return m.Monitor(ctx) })
	}
	g.Go(func() error { return d.run(ctx, g) })
	return g.Wait()
}

func (d *Daemon) run(ctx context.Context, g *errgroup.Group) error {
	if err := privateDir(d.o.StateDir); err != nil {
		return err
	}
	if p, ok := d.o.Subnets.(LeasePrefetcher); ok {
		p.PrefetchLeases(ctx)
	}
	cfg, err := d.networkConfig(ctx)
	if err != nil || cfg == nil {
		return err
	}
	ext, lease, nw, err := d.attach(ctx, cfg)
	if err != nil || nw == nil {
		return err
	}
	d.log.Debug("lease held, backend attached", "since_start", time.Since(d.started))
	// The node's setup (iptables rules, then subnet.env) runs beside the
	// first reconcile, which does not need it (tens of milliseconds of
	// iptables execs); the node is ready once both are done.
	setUp := make(chan error, 1)
	g.Go(func() error {
		rules, envFile, err := d.setUpNode(cfg, lease, nw)
		setUp <- err
		if err != nil {
			return err
		}
		d.log.Debug("forwarding, netfilter rules and subnet.env in place", "since_start", time.Since(d.started))
		g.Go(func() error { return envFile.Run(ctx) })
		return rules.Run(ctx)
	})
	g.Go(func() error { return d.o.Subnets.Run(ctx, d.publish) })
	if r, ok := nw.(backend.Runner); ok {
		g.Go(func() error { return r.Run(ctx) })
	}
	// The kernel flushes routes through a link that goes down without
	// announcing it, and a re-created link has a new index: watch the
	// external interface, and read it again before the next reconcile.
	d.ext = extWatch{name: ext.Link.Name, opts: withFamilies(d.o.Iface, cfg)}
	d.ext.index.Store(int64(ext.Link.Index))
	d.ext.last.Store(&ext)
	policySynced := make(chan struct{})
	if d.o.Policy != nil {
		var local []netip.Prefix
		for _, p := range []netip.Prefix{lease.Subnet, lease.IPv6Subnet} {
			if p.IsValid() {
				local = append(local, p)
			}
		}
		synced := sync.OnceFunc(func() { close(policySynced) })
		g.Go(func() error { return d.o.Policy(ctx, local, synced) })
	} else {
		close(policySynced)
	}
	d.afterFirstReconcile = d.afterReady(ctx, g, cfg, nw, setUp, policySynced)
	return d.reconcileLoop(ctx, cfg, lease, nw)
}

// attach chooses the external interface, prepares the backend, takes the
// lease and attaches the backend to it. A nil Network with no error means
// the daemon was stopped while waiting for an address or the lease.
func (d *Daemon) attach(ctx context.Context, cfg *subnet.Config) (backend.ExternalInterface, subnet.Lease, backend.Network, error) {
	var lease subnet.Lease
	ext, be, attrs, err := d.prepare(ctx, cfg)
	if err != nil || be == nil {
		return ext, lease, nil, err
	}
	var hint subnet.Lease
	if env, err := subnet.ReadEnv(d.o.SubnetFile); err == nil {
		hint = subnet.Lease{Subnet: env.Subnet, IPv6Subnet: env.IPv6Subnet}
	}
	lease, err = d.o.Subnets.AcquireLease(ctx, cfg, attrs, hint)
	if err != nil {
		if ctx.Err() != nil {
			return ext, lease, nil, nil // stopped while waiting for the lease
		}
		return ext, lease, nil, fmt.Errorf("acquiring a subnet lease: %w", err)
	}
	d.log.Info("holding lease", "subnet", lease.Subnet, "ipv6_subnet", lease.IPv6Subnet, "backend", cfg.BackendType)
	nw, err := be.Attach(ctx, lease)
	if err != nil {
		return ext, lease, nil, fmt.Errorf("attaching the %s backend to %s: %w", cfg.BackendType, lease, err)
	}
	return ext, lease, nw, nil
}

// prepare chooses the external interface and prepares the backend on it.
// An interface that lacks the address of a family the backend publishes
// (backend.NoAddressError: IPv6 from SLAAC or DHCPv6 may come after boot)
// is waited for, the daemon alive and not ready, and read again. A nil
// Backend with no error means the daemon was stopped while waiting.
func (d *Daemon) prepare(ctx context.Context, cfg *subnet.Config) (backend.ExternalInterface, backend.Backend, subnet.LeaseAttrs, error) {
	bo := backoff.Backoff{Min: 500 * time.Millisecond, Max: 10 * time.Second}
	for {
		ext, err := network.ChooseExternal(d.o.Netlink, withFamilies(d.o.Iface, cfg))
		if err != nil {
			return ext, nil, subnet.LeaseAttrs{}, err
		}
		d.log.Info("using external interface", "iface", ext.Link.Name, "addr", ext.Addr, "public_ip", ext.PublicIP, "mtu", ext.Link.MTU)
		be, err := d.o.Registry.New(cfg.BackendType, backend.Options{
			Logger: d.log, Netlink: d.o.Netlink, ExtIface: ext, Config: cfg, StateDir: d.o.StateDir,
			FullSyncEvery: d.o.Resync, KeyRotations: d.o.KeyRotations,
			Metrics: &backend.Metrics{DriftRepairs: d.metrics.driftRepairs, PeersUnroutable: d.metrics.unroutable, Registerer: d.metrics.reg},
		})
		if err != nil {
			return ext, nil, subnet.LeaseAttrs{}, err
		}
		attrs, err := be.Prepare(ctx)
		var noAddr *backend.NoAddressError
		if !errors.As(err, &noAddr) {
			if err != nil {
				return ext, nil, attrs, fmt.Errorf("preparing the %s backend: %w", cfg.BackendType, err)
			}
			return ext, be, attrs, nil
		}
		delay := bo.Next()
		d.log.Warn("waiting for the external interface's address", "err", err, "retry_in", delay)
		d.heartbeat.Store(time.Now().UnixNano()) // alive, only waiting
		if !backoff.Sleep(ctx, delay) {
			return ext, nil, subnet.LeaseAttrs{}, nil
		}
	}
}

// setUpNode enables forwarding, installs the netfilter rules in the mode
// chosen and writes subnet.env (pods are wired only once masquerading is
// in place), returning what keeps the last two in place.
func (d *Daemon) setUpNode(cfg *subnet.Config, lease subnet.Lease, nw backend.Network) (Runner, *desiredfile.Keeper, error) {
	env := subnet.Env{MTU: nw.MTU(), IPMasq: d.o.IPMasq, Backend: cfg.BackendType}
	if ep, ok := nw.(backend.EnvProvider); ok {
		env.Extra = ep.Env()
	}
	o := netfilter.Options{Logger: d.log, IPMasq: d.o.IPMasq, Resync: d.o.IPTablesResync, Repaired: func() { d.metrics.driftRepairs.Inc() }}
	if cfg.EnableIPv4 {
		o.Networks = append(o.Networks, network.NetworkPair{Cluster: cfg.Network, Local: lease.Subnet})
		env.Network, env.Subnet = cfg.Network, lease.Subnet
	}
	if cfg.EnableIPv6 && lease.IPv6Subnet.IsValid() {
		o.Networks = append(o.Networks, network.NetworkPair{Cluster: cfg.IPv6Network, Local: lease.IPv6Subnet})
		env.IPv6Network, env.IPv6Subnet = cfg.IPv6Network, lease.IPv6Subnet
	}
	node := d.o.Node
	if node == nil {
		node = systemNode{mode: d.o.Netfilter}
	}
	mode, keeper, err := node.SetUp(cfg, o)
	if err != nil {
		return nil, nil, err
	}
	env.Netfilter = string(mode)
	// subnet.env is desired state like a route: deleted or altered, it is
	// written again at once.
	envFile := &desiredfile.Keeper{Path: d.o.SubnetFile, Logger: d.log, Repaired: func() { d.metrics.driftRepairs.Inc() }}
	if err := envFile.Set(env.Marshal()); err != nil {
		return nil, nil, err
	}
	return keeper, envFile, nil
}

// afterReady is what runs once the first reconcile is done: it waits for
// the node's setup, then starts the kernel watch, the external interface
// watch, the reclaiming of leaked addresses and the CNI conflist (a node
// takes pods only once it routes).
func (d *Daemon) afterReady(ctx context.Context, g *errgroup.Group, cfg *subnet.Config, nw backend.Network, setUp <-chan error, policySynced <-chan struct{}) func() error {
	steps := []func() error{func() error {
		select {
		case err := <-setUp:
			return err
		case <-ctx.Done():
			return ctx.Err()
		}
	}}
	watching := make(chan struct{})
	if w, ok := nw.(backend.KernelWatcher); ok {
		// Watching starts after the first reconcile, so that the watcher
		// does not decode thousands of events about our own initial
		// programming. Once subscribed it checks the kernel against the
		// record and pokes if they differ: nothing that changed before the
		// subscription goes unnoticed.
		once := sync.OnceFunc(func() { close(watching) })
		steps = append(steps, func() error { g.Go(func() error { return w.WatchKernel(ctx, d.requestFull, once) }); return nil })
	} else {
		close(watching)
	}
	if d.o.Allocations.Dir != "" && d.o.Allocations.Every > 0 {
		steps = append(steps, func() error { g.Go(func() error { return d.reclaimLoop(ctx) }); return nil })
	}
	// A pod must never start on a node whose policy is not yet enforced.
	steps = append(steps, func() error {
		select {
		case <-policySynced:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	})
	if d.o.CNIConflistPath != "" {
		conflist := &desiredfile.Keeper{Path: d.o.CNIConflistPath, Logger: d.log, Repaired: func() { d.metrics.driftRepairs.Inc() }}
		steps = append(steps, func() error {
			if err := conflist.Set(d.o.CNIConflist); err != nil {
				return fmt.Errorf("installing the CNI conflist: %w", err)
			}
			d.log.Info("installed the CNI conflist", "path", d.o.CNIConflistPath)
			g.Go(func() error { return conflist.Run(ctx) })
			return nil
		})
	}
	steps = append(steps, func() error { g.Go(func() error { return d.watchExternal(ctx) }); return nil })
	// What flannel left goes once twill's routes and rules are in place.
	steps = append(steps, func() error { g.Go(func() error { return d.takeOver(cfg).Run(ctx) }); return nil })
	steps = append(steps, func() error { return d.awaitKernelWatch(ctx, watching) })
	return func() error {
		for _, f := range steps {
			if err := f(); err != nil {
				return err
			}
		}
		return nil
	}
}

// publishData publishes the backend's new data in the node's lease, when it
// has some; a failure is retried with the next reconcile.
func (d *Daemon) publishData(ctx context.Context, nw backend.Network) error {
	if d.pendingData == nil {
		p, ok := nw.(backend.DataPublisher)
		if !ok {
			return nil
		}
		data, v6Data, changed := p.BackendData()
		if !changed {
			return nil
		}
		d.pendingData = &[2]json.RawMessage{data, v6Data}
	}
	u, ok := d.o.Subnets.(DataUpdater)
	if !ok {
		d.pendingData = nil
		return errors.New("the backend changed its lease data, but this subnet manager cannot publish it; restart twilld")
	}
	if err := u.UpdateBackendData(ctx, d.pendingData[0], d.pendingData[1]); err != nil {
		return fmt.Errorf("publishing the backend's new data: %w", err)
	}
	d.log.Info("published new backend data in this node's lease", "data", string(d.pendingData[0]), "v6_data", string(d.pendingData[1]))
	d.pendingData = nil
	return nil
}

func withFamilies(o network.IfaceOptions, cfg *subnet.Config) network.IfaceOptions {
	o.IPv4, o.IPv6 = cfg.EnableIPv4, cfg.EnableIPv6
	return o
}

// networkConfig waits for the configuration, retrying with backoff and a
// clear message: a node may start before the operator has written it.
func (d *Daemon) networkConfig(ctx context.Context) (*subnet.Config, error) {
	bo := backoff.Backoff{Min: 500 * time.Millisecond, Max: 10 * time.Second}
	for {
		// A datastore that does not answer must not hold the daemon
		// silent: each attempt is bounded, and its failure logged.
		actx, cancel := context.WithTimeout(ctx, 10*time.Second)
		cfg, err := d.o.Subnets.NetworkConfig(actx)
		cancel()
		if err == nil {
			return cfg, nil
		}
		if errors.Is(err, subnet.ErrInvalidConfig) {
			// A configuration that is there but wrong will not fix itself
			// by waiting; say so and stop.
			return nil, err
		}
		delay := bo.Next()
		d.log.Warn("waiting for the network configuration", "err", err, "retry_in", delay)
		if !backoff.Sleep(ctx, delay) {
			return nil, nil
		}
	}
}

// publish folds a change of the leases in and pokes the loop; it never
// blocks.
func (d *Daemon) publish(c subnet.Change) {
	d.peers.apply(c)
	d.signal()
}

func (d *Daemon) signal() {
	select {
	case d.poke <- struct{}{}:
	default:
	}
}

// requestFull asks for a full reconcile: the kernel changed behind the
// backend's back.
func (d *Daemon) requestFull() {
	d.fullDue.Store(true)
	d.signal()
}

func (d *Daemon) reconcileLoop(ctx context.Context, cfg *subnet.Config, local subnet.Lease, nw backend.Network) error {
	tick := time.NewTicker(d.o.Resync)
	defer tick.Stop()
	var (
		retry  *time.Timer
		retryC <-chan time.Time
		bo     = backoff.Backoff{Min: 200 * time.Millisecond, Max: 30 * time.Second}
	)
	for {
		d.heartbeat.Store(time.Now().UnixNano())
		select {
		case <-ctx.Done():
			return nil
		case <-d.poke:
		case <-tick.C:
			d.fullDue.Store(true)
		case <-retryC:
			d.fullDue.Store(true)
		}
		have, changedAll := d.peers.ready()
		if !have {
			continue // never reconcile before the first listing: it would delete every route
		}
		if d.ext.dirty.Swap(false) {
			d.refreshExternal(nw)
			d.fullDue.Store(true)
		}
		start := time.Now()
		full, err := d.reconcileOnce(ctx, cfg, local, nw, changedAll)
		if perr := d.publishData(ctx, nw); perr != nil {
			err = errors.Join(err, perr)
		}
		took := time.Since(start)
		peers, refused := d.peers.count()
		d.metrics.reconcileDuration.Observe(took.Seconds())
		d.metrics.leases.Set(float64(peers))
		d.metrics.refused.Set(float64(refused))
		d.log.Debug("reconciled", "full", full, "peers", peers, "took", took)
		if err != nil {
			d.metrics.reconcileErrors.Inc()
			retryDelay := bo.Next()
			d.log.Warn("reconcile failed; retrying", "err", err, "retry_in", retryDelay)
			if retry != nil {
				retry.Stop()
			}
			retry = time.NewTimer(retryDelay)
			retryC = retry.C
			continue
		}
		bo.Reset()
		retryC = nil
		if !d.ready.Load() {
			if err := d.becomeReady(ctx); err != nil {
				return err
			}
			d.log.Info("ready", "peers", peers, "took_reconcile", took.Round(time.Millisecond), "since_start", time.Since(d.started).Round(time.Millisecond))
		}
	}
}

// reconcileOnce hands the backend what changed since the last time when
// it can take that (backend.Updater), and every peer otherwise: at the
// first turn, after a full set arrived, on a resync, a retry or drift. It
// reports whether it was a full reconcile.
func (d *Daemon) reconcileOnce(ctx context.Context, cfg *subnet.Config, local subnet.Lease, nw backend.Network, changedAll bool) (bool, error) {
	up, canUpdate := nw.(backend.Updater)
	if canUpdate && d.ready.Load() && !changedAll && !d.fullDue.Load() {
		upserted, removed := d.peers.delta(cfg, local)
		if len(upserted)+len(removed) == 0 {
			return false, nil
		}
		err := up.Update(ctx, upserted, removed)
		if !errors.Is(err, backend.ErrFullReconcile) {
			if err != nil {
				d.fullDue.Store(true) // the retry starts from the whole state
			}
			return false, err
		}
	}
	d.fullDue.Store(false)
	return true, nw.Reconcile(ctx, d.peers.all(cfg, local))
}

// kernelWatchWait bounds how long readiness waits for the kernel watch's
// first check.
const kernelWatchWait = 10 * time.Second

// awaitKernelWatch waits until the kernel watch has made its first check:
// each reads every object twill programmed (three dumps of 50,000 with
// vxlan), which is start-up's work, not the first lease events'. A watch
// that cannot subscribe does not hold the node back for long: it keeps
// trying, and the periodic full reconcile repairs drift meanwhile.
func (d *Daemon) awaitKernelWatch(ctx context.Context, watching <-chan struct{}) error {
	t := time.NewTimer(kernelWatchWait)
	defer t.Stop()
	select {
	case <-watching:
		d.log.Debug("kernel watch checked", "since_start", time.Since(d.started))
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		d.log.Warn("the kernel watch has not started; ready without it (it keeps trying, and every --resync repairs drift meanwhile)", "waited", kernelWatchWait)
	}
	return nil
}

// becomeReady runs what waits for the first reconcile and tells the subnet
// manager the node is ready.
func (d *Daemon) becomeReady(ctx context.Context) error {
	if d.afterFirstReconcile != nil {
		if err := d.afterFirstReconcile(); err != nil {
			return err
		}
	}
	if r, ok := d.o.Subnets.(ReadyNotifier); ok {
		if err := r.Ready(ctx); err != nil {
			return err
		}
	}
	if d.o.Ready != nil {
		d.o.Ready()
		d.log.Debug("ready hook done", "since_start", time.Since(d.started))
	}
	d.ready.Store(true)
	return nil
}

func (d *Daemon) serveHealth(ctx context.Context, ln net.Listener) error {
	mux := http.NewServeMux()
	// Read-only: GET (and HEAD) alone; any other method is refused with
	// 405, and nothing served changes state.
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		last := time.Unix(0, d.heartbeat.Load())
		if since := time.Since(last); since > 3*d.o.Resync+10*time.Second {
			http.Error(w, fmt.Sprintf("reconcile loop stalled for %s", since.Round(time.Second)), http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		if m, ok := d.o.Subnets.(Monitor); ok {
			if up, why := m.Connected(); !up {
				http.Error(w, "not ready: "+why, http.StatusServiceUnavailable)
				return
			}
		}
		if !d.ready.Load() {
			http.Error(w, "not ready: lease, rules, subnet.env, first reconcile or kernel watch pending", http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ok")
	})
	mux.Handle("GET /metrics", promhttp.HandlerFor(d.metrics.reg, promhttp.HandlerOpts{}))
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}()
	if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("serving health endpoints: %w", err)
	}
	return nil
}

type metrics struct {
	reg               *prometheus.Registry
	leases            prometheus.Gauge
	refused           prometheus.Gauge
	unroutable        prometheus.Gauge
	reconcileDuration prometheus.Histogram
	reconcileErrors   prometheus.Counter
	driftRepairs      prometheus.Counter
	reclaimed         prometheus.Counter
}

func newMetrics() *metrics {
	m := &metrics{
		reg:        prometheus.NewRegistry(),
		leases:     prometheus.NewGauge(prometheus.GaugeOpts{Name: "twill_leases", Help: "Valid peer leases handed to the backend."}),
		refused:    prometheus.NewGauge(prometheus.GaugeOpts{Name: "twill_leases_refused", Help: "Leases refused (malformed, outside Network, overlapping, wrong backend)."}),
		unroutable: prometheus.NewGauge(prometheus.GaugeOpts{Name: "twill_peers_unroutable", Help: "Peers the backend cannot reach (host-gw: public IP not on-link)."}),
		reconcileDuration: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "twill_reconcile_duration_seconds", Help: "Time to reconcile the backend with the lease set.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 14)}),
		reconcileErrors: prometheus.NewCounter(prometheus.CounterOpts{Name: "twill_reconcile_errors_total", Help: "Reconciles that returned an error."}),
		driftRepairs:    prometheus.NewCounter(prometheus.CounterOpts{Name: "twill_drift_repairs_total", Help: "Kernel objects repaired because they drifted from what twill programmed."}),
	}
	m.reclaimed = prometheus.NewCounter(prometheus.CounterOpts{Name: "twill_addresses_reclaimed_total",
		Help: "Pod address allocations released because their pod was gone (its DEL never came)."})
	m.reg.MustRegister(m.leases, m.refused, m.unroutable, m.reconcileDuration, m.reconcileErrors, m.driftRepairs, m.reclaimed)
	return m
}

// connected exports whether the subnet manager reaches its datastore.
func (m *metrics) connected(mon Monitor) {
	m.reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "twill_subnet_manager_connected",
		Help: "1 while the subnet manager reaches its datastore (etcd), 0 while it cannot."},
		func() float64 {
			if ok, _ := mon.Connected(); ok {
				return 1
			}
			return 0
		}))
}

// conflicts exports the lease conflicts seen: records refused for
// claiming a public IP another lease holds, and (etcd mode) overwrites of
// this node's own lease by another client.
func (m *metrics) conflicts(peers *peerSet, own ConflictCounter) {
	m.reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "twill_lease_conflicts_total",
		Help: "Leases refused for claiming a public IP another lease holds, and overwrites of this node's own lease by another client."},
		func() float64 {
			n := peers.conflictCount()
			if own != nil {
				n += own.OwnLeaseConflicts()
			}
			return float64(n)
		}))
}

// privateDir makes the state directory (keys, the VTEP MAC) if missing
// and leaves it readable by its owner alone, 0700, even when it was made
// looser (a hostPath's DirectoryOrCreate makes 0755). Empty: none.
func privateDir(dir string) error {
	if dir == "" {
		return nil
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("--state-dir %s: %w", dir, err)
	}
	if err := os.Chmod(dir, 0o700); err != nil {
		return fmt.Errorf("--state-dir %s: %w", dir, err)
	}
	return nil
}
