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
	"golang.org/x/sync/errgroup"

	"github.com/twill-net/twill/backend"
	"github.com/twill-net/twill/internal/backoff"
	"github.com/twill-net/twill/internal/runlock"
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

// Subnets is the subnet manager the daemon runs on, with what it offers
// beyond SubnetManager. A nil field is a capability it does not have: the
// daemon uses these fields and never asserts a type to find one, so the
// code that builds a daemon says in one place what its manager does:
//
//	daemon.Subnets{SubnetManager: m, Monitor: m, DataUpdater: m}
type Subnets struct {
	SubnetManager
	Monitor     Monitor
	Conflicts   ConflictCounter
	DataUpdater DataUpdater
	Prefetcher  LeasePrefetcher
	Ready       ReadyNotifier
}

// Monitor (Subnets.Monitor) is offered by subnet managers that follow their connection
// to the datastore (etcd): Monitor runs for the daemon's whole life, from
// before the configuration is read, and Connected feeds /readyz and
// twill_subnet_manager_connected.
type Monitor interface {
	Monitor(ctx context.Context) error
	Connected() (ok bool, why string)
}

// ConflictCounter (Subnets.Conflicts) is offered by subnet managers that notice another
// client overwriting this node's own lease (etcd mode): how many times.
type ConflictCounter interface {
	OwnLeaseConflicts() uint64
}

// DataUpdater (Subnets.DataUpdater) is offered by subnet managers that can change the
// backend data of the node's lease after it was taken (a new vxlan VTEP
// MAC).
type DataUpdater interface {
	UpdateBackendData(ctx context.Context, data, v6Data json.RawMessage) error
}

// LeasePrefetcher (Subnets.Prefetcher) is offered by subnet managers that can start
// reading every lease before AcquireLease is called (the etcd one: one
// range read that then overlaps reading the configuration, choosing the
// interface and preparing the backend).
type LeasePrefetcher interface {
	PrefetchLeases(ctx context.Context)
}

// ReadyNotifier (Subnets.Ready) is offered by subnet managers that publish the node's
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
	Subnets  Subnets
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
	// Resync is the period of the full reconcile that repairs drift, and
	// of the reconcile loop's heartbeat, while the kernel watches have not
	// started.
	Resync time.Duration
	// WatchedResync is the period of the full reconcile once the kernel
	// watches run (5 min when zero, never below Resync): they ask for one
	// as soon as they see drift, so this one is a safety net, and each
	// reads every object back (about 20 ms at 5,000 host-gw peers).
	WatchedResync time.Duration
	// HealthAddr serves /healthz, /readyz and /metrics; empty disables.
	HealthAddr string
	// StartedUp, when set, is called once the first reconcile has
	// programmed the peers and the node's forwarding, rules and
	// subnet.env are in place: before the node waits for its policy table
	// and reports ready. twilld collects start-up's garbage there
	// (internal/gcpace), so that the policy table's first write, the
	// largest transient at 10,000 pods, runs at the steady GC percent.
	StartedUp func()
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
	// Handlers are more read-only endpoints beside /metrics, by path
	// (the verdict log's /verdicts); they answer GET and HEAD only.
	Handlers map[string]http.Handler
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
	// watched is set once every kernel watch has subscribed and made its
	// first check: full reconciles are then due every WatchedResync.
	watched atomic.Bool
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
	if o.WatchedResync <= 0 {
		o.WatchedResync = 5 * time.Minute
	}
	o.WatchedResync = max(o.WatchedResync, o.Resync)
	d := &Daemon{o: o, log: o.Logger, metrics: newMetrics(), poke: make(chan struct{}, 1), peers: newPeerSet(o.Logger)}
	d.metrics.reg.MustRegister(o.Collectors...)
	d.metrics.conflicts(d.peers, o.Subnets.Conflicts)
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
	if m := d.o.Subnets.Monitor; m != nil {
		d.metrics.connected(m)
		g.Go(func() error { return m.Monitor(ctx) })
	}
	g.Go(func() error { return d.run(ctx, g) })
	err := g.Wait()
	if errors.Is(err, subnet.ErrLeaseGone) && d.o.SubnetFile != "" {
		// subnet.env describes a lease nobody holds now: a pod wired from
		// it would get an address no node routes to. Without it the plugin
		// refuses new pods (the runtime retries) until the next twilld
		// has taken the node's new lease.
		if rerr := os.Remove(d.o.SubnetFile); rerr != nil && !errors.Is(rerr, os.ErrNotExist) {
			err = errors.Join(err, fmt.Errorf("removing %s: %w", d.o.SubnetFile, rerr))
		} else {
			d.log.Warn("this node's lease is gone: removed subnet.env, so that no pod is wired from it", "subnet_file", d.o.SubnetFile)
		}
	}
	return err
}

func (d *Daemon) run(ctx context.Context, g *errgroup.Group) error {
	if err := privateDir(d.o.StateDir, d.log); err != nil {
		return err
	}
	if d.o.SubnetFile != "" {
		// Held until the process exits: twilld cleanup waits for it.
		release, err := runlock.Hold(runlock.Path(d.o.SubnetFile))
		if err != nil {
			return err
		}
		go func() { <-ctx.Done(); release() }()
	}
	if d.o.Subnets.Prefetcher != nil {
		d.o.Subnets.Prefetcher.PrefetchLeases(ctx)
	}
	cfg, err := d.networkConfig(ctx)
	if err != nil || cfg == nil {
		return err
	}
	ext, lease, nw, err := d.attach(ctx, cfg)
	if err != nil || !nw.Valid() {
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
	if nw.Runner != nil {
		g.Go(func() error { return nw.Runner.Run(ctx) })
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
func (d *Daemon) attach(ctx context.Context, cfg *subnet.Config) (backend.ExternalInterface, subnet.Lease, backend.Attached, error) {
	var lease subnet.Lease
	ext, be, attrs, err := d.prepare(ctx, cfg)
	if err != nil || be == nil {
		return ext, lease, backend.Attached{}, err
	}
	var hint subnet.Lease
	if env, err := subnet.ReadEnv(d.o.SubnetFile); err == nil {
		hint = subnet.Lease{Subnet: env.Subnet, IPv6Subnet: env.IPv6Subnet}
	}
	lease, err = d.o.Subnets.AcquireLease(ctx, cfg, attrs, hint)
	if err != nil {
		if ctx.Err() != nil {
			return ext, lease, backend.Attached{}, nil // stopped while waiting for the lease
		}
		return ext, lease, backend.Attached{}, fmt.Errorf("acquiring a subnet lease: %w", err)
	}
	d.log.Info("holding lease", "subnet", lease.Subnet, "ipv6_subnet", lease.IPv6Subnet, "backend", cfg.BackendType)
	nw, err := be.Attach(ctx, lease)
	if err == nil && !nw.Valid() {
		err = errors.New("the backend returned no Network")
	}
	if err == nil && nw.Data != nil && d.o.Subnets.DataUpdater == nil {
		err = errors.New("the backend publishes data that changes after the lease is taken, and this subnet manager cannot publish it (no DataUpdater)")
	}
	if err != nil {
		return ext, lease, backend.Attached{}, fmt.Errorf("attaching the %s backend to %s: %w", cfg.BackendType, lease, err)
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
			FullSyncEvery: d.o.Resync, WatchedSyncEvery: d.watchedSyncEvery(), KeyRotations: d.o.KeyRotations,
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
