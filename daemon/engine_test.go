package daemon_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twill-net/twill/backend"
	"github.com/twill-net/twill/backend/backendtest"
	"github.com/twill-net/twill/backend/hostgw"
	"github.com/twill-net/twill/daemon"
	"github.com/twill-net/twill/network"
	"github.com/twill-net/twill/network/netfilter"
	"github.com/twill-net/twill/nl"
	"github.com/twill-net/twill/nl/nlfake"
	"github.com/twill-net/twill/subnet"
	"github.com/twill-net/twill/testsupport/logtest"
)

// The daemon's engine without root: leases go in through a subnet manager
// in memory, the kernel is nl/nlfake's model, and what comes out is what an
// operator reads on a node: the routes, subnet.env, the CNI conflist and
// readiness. The backend is host-gw, alone or wrapped to act as backends
// that need a full reconcile or publish new lease data do.

const engineConf = `{"Network":"10.244.0.0/16","Backend":{"Type":"%s"}}`

// memSubnets is a subnet manager in memory: this node's lease is
// 10.244.1.0/24, the peers are published as one full set, then as
// changes (add); backend data the node publishes is kept (data).
type memSubnets struct {
	conf    string
	peers   []subnet.Lease
	publish chan func(subnet.Change)
	gone    chan struct{} // closed: the node's lease is gone (Run says so)

	mu   sync.Mutex
	data json.RawMessage // guarded by mu
}

func (m *memSubnets) NetworkConfig(context.Context) (*subnet.Config, error) {
	return subnet.ParseConfig([]byte(m.conf))
}

func (m *memSubnets) AcquireLease(_ context.Context, _ *subnet.Config, a subnet.LeaseAttrs, _ subnet.Lease) (subnet.Lease, error) {
	m.mu.Lock()
	m.data = a.BackendData
	m.mu.Unlock()
	return subnet.Lease{Subnet: netip.MustParsePrefix("10.244.1.0/24"), Attrs: a}, nil
}

func (m *memSubnets) Run(ctx context.Context, publish func(subnet.Change)) error {
	c := subnet.Change{Full: true}
	for _, l := range m.peers {
		c.Set = append(c.Set, subnet.Entry{Key: l.Key(), Lease: l})
	}
	publish(c)
	m.publish <- publish
	select {
	case <-ctx.Done():
		return nil
	case <-m.gone:
		return fmt.Errorf("the test's Node deleted: %w", subnet.ErrLeaseGone)
	}
}

func (m *memSubnets) UpdateBackendData(_ context.Context, data, _ json.RawMessage) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.data = data
	return nil
}

func (m *memSubnets) backendData() string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return string(m.data)
}

// memNode is forwarding and netfilter as state: the networks whose rules
// are installed. SetUp waits for gate, so that a test can look at the node
// while its setup is still under way.
type memNode struct {
	gate chan struct{}
	open func() // closes gate, once

	mu       sync.Mutex
	networks []string // guarded by mu
}

func newMemNode() *memNode {
	gate := make(chan struct{})
	return &memNode{gate: gate, open: sync.OnceFunc(func() { close(gate) })}
}

func (n *memNode) SetUp(_ *subnet.Config, o netfilter.Options) (netfilter.Mode, daemon.Runner, error) {
	<-n.gate
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, p := range o.Networks {
		n.networks = append(n.networks, p.Cluster.String()+" local "+p.Local.String())
	}
	return netfilter.NFTables, blockRunner{}, nil
}

func (n *memNode) installed() []string {
	n.mu.Lock()
	defer n.mu.Unlock()
	return slices.Clone(n.networks)
}

type blockRunner struct{}

func (blockRunner) Run(ctx context.Context) error { <-ctx.Done(); return nil }

// wrapped is host-gw acting as a backend whose Update asks for a full
// reconcile (full), or whose lease data changes after its first reconcile
// (data).
type wrapped struct {
	backend.Network
	full       bool
	data       bool
	reconciles atomic.Int32
}

func (w *wrapped) Reconcile(ctx context.Context, peers []subnet.Lease) error {
	w.reconciles.Add(1)
	return w.Network.Reconcile(ctx, peers)
}

func (w *wrapped) Update(context.Context, []subnet.Lease, []subnet.Lease) error {
	if w.full {
		return backend.ErrFullReconcile
	}
	return errors.New("wrapped: Update is only used with full")
}

func (w *wrapped) BackendData() (json.RawMessage, json.RawMessage, bool) {
	if !w.data || w.reconciles.Load() == 0 {
		return nil, nil, false
	}
	return json.RawMessage(`{"Generation":2}`), nil, true
}

type wrappedBackend struct {
	backend.Backend
	w *wrapped
}

func (b wrappedBackend) Attach(ctx context.Context, l subnet.Lease) (backend.Attached, error) {
	a, err := b.Backend.Attach(ctx, l)
	b.w.Network = a.Network
	return backend.Attached{Network: b.w, Updater: b.w, Data: b.w}, err
}

func peerLease(sub, pub string) subnet.Lease {
	return subnet.Lease{Subnet: netip.MustParsePrefix(sub), Attrs: subnet.LeaseAttrs{PublicIP: netip.MustParseAddr(pub), BackendType: hostgw.Type}}
}

type engine struct {
	t        *testing.T
	k        *nlfake.Kernel
	subnets  *memSubnets
	node     *memNode
	d        *daemon.Daemon
	dir      string
	log      *logtest.Buffer
	done     chan error
	wrapped  *wrapped
	cancel   context.CancelFunc
	attempts atomic.Int32
}

// startEngine runs a daemon on a fake kernel with eth0 (192.168.1.1/24),
// whose first failRoutes route changes the kernel refuses.
func startEngine(t *testing.T, typ string, w *wrapped, failRoutes int32, peers ...subnet.Lease) *engine {
	return startEngineWith(t, typ, w, failRoutes, nil, peers...)
}

// startEngineWith is startEngine with adjust applied to the daemon's
// options.
func startEngineWith(t *testing.T, typ string, w *wrapped, failRoutes int32, adjust func(e *engine, o *daemon.Options), peers ...subnet.Lease) *engine {
	k := &nlfake.Kernel{}
	k.AddLink("lo", 65536, true, netip.MustParsePrefix("127.0.0.1/8"))
	k.AddLink("eth0", 1500, true, netip.MustParsePrefix("192.168.1.1/24"))
	e := &engine{t: t, k: k, node: newMemNode(), dir: t.TempDir(), log: &logtest.Buffer{}, done: make(chan error, 1), wrapped: w,
		subnets: &memSubnets{conf: fmt.Sprintf(engineConf, typ), peers: peers, publish: make(chan func(subnet.Change), 1)}}
	k.Fail = func(what string) error {
		if what == "route" && e.attempts.Add(1) <= failRoutes {
			return errors.New("the kernel refused (the test's)")
		}
		return nil
	}
	reg := &backend.Registry{}
	reg.Register(hostgw.Type, hostgw.New)
	reg.Register("wrapped", func(o backend.Options) (backend.Backend, error) {
		b, err := hostgw.New(o)
		return wrappedBackend{Backend: b, w: w}, err
	})
	ctx, cancel := context.WithCancel(context.Background())
	e.cancel = cancel
	o := daemon.Options{
		Logger: slog.New(slog.NewTextHandler(e.log, &slog.HandlerOptions{Level: slog.LevelDebug})), Registry: reg, Subnets: daemon.Subnets{SubnetManager: e.subnets, DataUpdater: e.subnets}, Netlink: k,
		Iface: network.IfaceOptions{Ifaces: []string{"eth0"}}, Node: e.node, IPMasq: true, Resync: time.Hour, StateDir: filepath.Join(e.dir, "state"),
		SubnetFile: filepath.Join(e.dir, "subnet.env"), FlannelSubnetFile: filepath.Join(e.dir, "no-flannel.env"),
		CNIConflist: []byte(`{"cniVersion":"1.0.0","name":"twill","plugins":[{"type":"twill"}]}`), CNIConflistPath: filepath.Join(e.dir, "10-twill.conflist"),
	}
	if adjust != nil {
		adjust(e, &o)
	}
	e.d = daemon.New(o)
	go func() { e.done <- e.d.Run(ctx) }()
	t.Cleanup(func() {
		e.node.open()
		cancel()
		select {
		case err := <-e.done:
			if err != nil {
				t.Errorf("the daemon stopped with %v", err)
			}
		case <-time.After(30 * time.Second):
			t.Error("the daemon did not stop within 30s of its context's end")
		}
		if t.Failed() {
			t.Logf("daemon log:\n%s", e.log.String())
		}
	})
	return e
}

func (e *engine) routes() []string { return backendtest.Routes(e.t, e.k, 0) }

func (e *engine) waitFor(what string, ok func() bool) {
	e.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !ok() {
		select {
		case err := <-e.done:
			e.done <- err // for the cleanup
			e.t.Fatalf("waiting for %s: the daemon stopped: %v", what, err)
		default:
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("%s: not within 30s (routes %q)", what, e.routes())
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func fileExists(path string) bool { _, err := os.Stat(path); return err == nil }

func TestEngine(t *testing.T) {
	peer2 := peerLease("10.244.2.0/24", "192.168.1.2")
	peer3 := peerLease("10.244.3.0/24", "192.168.1.3")
	offLink := peerLease("10.244.4.0/24", "10.9.9.9")    // host-gw refuses it
	outside := peerLease("10.250.0.0/24", "192.168.1.5") // the daemon refuses it: not in Network
	foreign := peerLease("10.244.6.0/24", "192.168.1.6") // the daemon refuses it: another backend
	foreign.Attrs.BackendType = "vxlan"
	route2, route3 := "10.244.2.0/24 via 192.168.1.2 dev#2", "10.244.3.0/24 via 192.168.1.3 dev#2"
	for _, tt := range []struct {
		name string
		typ  string
		w    *wrapped
		fail int32
		// then runs once the node is ready.
		then func(t *testing.T, e *engine)
	}{
		{name: "leases in, routes and subnet.env out; refused peers get nothing", typ: hostgw.Type,
			then: func(t *testing.T, e *engine) {
				if got, want := e.routes(), []string{route2}; !slices.Equal(got, want) {
					t.Errorf("routes %q, want %q: the off-link, foreign and out-of-Network peers refused", got, want)
				}
				for _, l := range []string{"10.244.4.0/24", "10.250.0.0/24", "10.244.6.0/24"} {
					if !strings.Contains(e.log.String(), l) {
						t.Errorf("the log never names the refused lease %s", l)
					}
				}
			}},
		{name: "a route the kernel refuses is retried until it is in", typ: hostgw.Type, fail: 3,
			then: func(t *testing.T, e *engine) {
				if got := e.attempts.Load(); got <= 3 {
					t.Errorf("%d route attempts, want more than the 3 refused", got)
				}
				if got, want := e.routes(), []string{route2}; !slices.Equal(got, want) {
					t.Errorf("routes %q, want %q", got, want)
				}
				if !strings.Contains(e.log.String(), "reconcile failed; retrying") {
					t.Error("the refused routes were never reported")
				}
			}},
		{name: "an Update asking for a full reconcile gets one", typ: "wrapped", w: &wrapped{full: true},
			then: func(t *testing.T, e *engine) {
				before := e.wrapped.reconciles.Load()
				publish := <-e.subnets.publish
				p := peer3
				p.Attrs.BackendType = "wrapped"
				publish(subnet.Change{Set: []subnet.Entry{{Key: p.Key(), Lease: p}}})
				e.waitFor("node3's route, through a full reconcile", func() bool { return slices.Contains(e.routes(), route3) })
				if e.wrapped.reconciles.Load() == before {
					t.Error("the route came without a full Reconcile")
				}
				if strings.Contains(e.log.String(), "reconcile failed") {
					t.Error("the request for a full reconcile was taken for a failure (and retried after a delay)")
				}
			}},
		{name: "the external interface down and up again: its routes come back", typ: hostgw.Type,
			then: func(t *testing.T, e *engine) {
				eth, err := e.k.LinkByName("eth0")
				if err != nil {
					t.Fatal(err)
				}
				e.k.SetUp(eth.Index, false) // the kernel flushes its routes, without a word
				if got := e.routes(); len(got) != 0 {
					t.Fatalf("routes %q through a link that is down", got)
				}
				e.k.SetUp(eth.Index, true)
				e.waitFor("node2's route back through eth0", func() bool { return slices.Contains(e.routes(), route2) })
			}},
		{name: "a route deleted behind twill's back is put back", typ: hostgw.Type,
			then: func(t *testing.T, e *engine) {
				rs, err := e.k.Routes(nl.FamilyAll, nl.RouteFilter{Protocol: nl.RouteProtocol})
				if err != nil || len(rs) != 1 {
					t.Fatalf("twill's routes %v, %v: want node2's", rs, err)
				}
				if err := e.k.RouteDel(rs[0]); err != nil {
					t.Fatal(err)
				}
				e.waitFor("node2's route put back", func() bool { return slices.Contains(e.routes(), route2) })
			}},
		{name: "new backend data is published in the lease", typ: "wrapped", w: &wrapped{data: true},
			then: func(t *testing.T, e *engine) {
				e.waitFor("the new backend data in the lease", func() bool { return e.subnets.backendData() == `{"Generation":2}` })
			}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			peers := []subnet.Lease{peer2, offLink, outside, foreign}
			for i := range peers[:3] {
				peers[i].Attrs.BackendType = tt.typ
			}
			e := startEngine(t, tt.typ, tt.w, tt.fail, peers...)
			conflist := filepath.Join(e.dir, "10-twill.conflist")
			// The first reconcile runs beside the node's setup; readiness
			// and the CNI conflist wait for both.
			e.waitFor("node2's route before the node's setup is done", func() bool { return slices.Contains(e.routes(), route2) })
			time.Sleep(50 * time.Millisecond)
			if e.d.Ready() || fileExists(conflist) {
				t.Fatalf("ready %v, conflist written %v, before forwarding and the netfilter rules are in place", e.d.Ready(), fileExists(conflist))
			}
			e.node.open()
			e.waitFor("ready", e.d.Ready)
			if !fileExists(conflist) {
				t.Fatal("ready without the CNI conflist: pods cannot be started")
			}
			if got, want := e.node.installed(), []string{"10.244.0.0/16 local 10.244.1.0/24"}; !slices.Equal(got, want) {
				t.Errorf("netfilter rules for %q, want %q", got, want)
			}
			env, err := subnet.ReadEnv(filepath.Join(e.dir, "subnet.env"))
			if err != nil {
				t.Fatal(err)
			}
			if env.Subnet.String() != "10.244.1.0/24" || env.Network.String() != "10.244.0.0/16" || env.MTU != 1500 || !env.IPMasq || env.Netfilter != "nftables" {
				t.Errorf("subnet.env %+v", env)
			}
			tt.then(t, e)
		})
	}
}

// TestEngineStoppedBeforeReadyIsNoError: a twilld stopped while it waits
// to become ready (here for a policy table that never syncs; in real life
// a SIGTERM during start-up) stops cleanly, as a stop after ready does,
// not with "context canceled" (a container that exits non-zero, a unit
// that failed).
// The node's lease gone while the daemon runs (its Node deleted, its
// podCIDR changed): the daemon stops with the subnet manager's error and
// takes subnet.env away, so that no pod is wired from a lease nobody holds
// before the next twilld has taken the new one.
func TestEngineLeaseGoneTakesSubnetEnvAway(t *testing.T) {
	gone := make(chan struct{})
	e := startEngineWith(t, hostgw.Type, nil, 0, func(e *engine, _ *daemon.Options) { e.subnets.gone = gone },
		peerLease("10.244.2.0/24", "192.168.1.2"))
	e.node.open()
	env := filepath.Join(e.dir, "subnet.env")
	e.waitFor("subnet.env written", func() bool { return fileExists(env) })
	close(gone)
	select {
	case err := <-e.done:
		e.done <- nil // for the cleanup
		if !errors.Is(err, subnet.ErrLeaseGone) {
			t.Errorf("the daemon stopped with %v, want the lease gone", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the daemon still runs 30s after its lease went")
	}
	if fileExists(env) {
		t.Error("subnet.env is still there: the next pod would get an address of a lease nobody holds")
	}
}

func TestEngineStoppedBeforeReadyIsNoError(t *testing.T) {
	e := startEngineWith(t, hostgw.Type, &wrapped{}, 0, func(e *engine, o *daemon.Options) {
		o.Policy = func(ctx context.Context, _ []netip.Prefix, _ func()) error { <-ctx.Done(); return nil }
	})
	e.node.open()
	e.waitFor("subnet.env, the last step before ready's wait for the policy", func() bool {
		_, err := os.Stat(filepath.Join(e.dir, "subnet.env"))
		return err == nil
	})
	// The cleanup stops the daemon and fails the test on an error.
}

// A backend that declares data to publish after the lease is taken, on a
// subnet manager that declares no way to publish it, stops the daemon at
// start, naming what is missing, before a pod is wired: not at the first
// change of the data, on a node already serving.
func TestEngineRefusesABackendItsSubnetManagerCannotServe(t *testing.T) {
	e := startEngineWith(t, "wrapped", &wrapped{data: true}, 0, func(e *engine, o *daemon.Options) {
		o.Subnets.DataUpdater = nil
	}, peerLease("10.244.2.0/24", "192.168.1.2"))
	select {
	case err := <-e.done:
		e.done <- nil // for the cleanup
		if err == nil || !strings.Contains(err.Error(), "DataUpdater") {
			t.Fatalf("the daemon stopped with %v, want an error naming DataUpdater", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the daemon still runs 30s after start")
	}
	if fileExists(filepath.Join(e.dir, "subnet.env")) {
		t.Error("subnet.env was written: pods would be wired on a node that stopped")
	}
	if got := e.routes(); len(got) != 0 {
		t.Errorf("routes programmed: %q", got)
	}
}
