// Package backend defines what a twill backend is and how the daemon finds
// one. A backend prepares the node (devices, sysctls) and says what the node
// publishes in its lease; once the lease is held it returns a Network, whose
// Reconcile makes the kernel match the full set of peer leases.
//
// Third-party backends live in their own package, call Register from init(),
// and are built into a twilld whose main blank-imports that package.
package backend

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/twill-net/twill/nl"
	"github.com/twill-net/twill/subnet"
)

// Backend is one node's instance of a backend type.
type Backend interface {
	// Prepare readies the node for this backend and returns the attributes
	// the node publishes with its lease (public IP, backend data).
	Prepare(ctx context.Context) (subnet.LeaseAttrs, error)
	// Attach is called once the node holds lease; the returned Network
	// programs the peers, and the rest of Attached declares what else the
	// backend offers.
	Attach(ctx context.Context, lease subnet.Lease) (Attached, error)
}

// Attached is what a backend offers once the node holds its lease: the
// Network every backend has, and each optional capability it declares. A
// nil field is a capability the backend does not have; the daemon and
// twillctl use these fields and nothing else (no capability is discovered
// by asserting a type), so a backend says what it does in one place:
//
//	return backend.Attached{Network: n, Updater: n, Watcher: n}, nil
//
// Attached is not a Network itself: kept in a Network variable, it would
// lose what it declares.
type Attached struct {
	// Network is required.
	Network Network
	// Updater applies a change of the peer set without the whole of it;
	// without it every change is a Reconcile.
	Updater Updater
	// Watcher notices changes made behind the Network's back; without it
	// drift is repaired at each resync only.
	Watcher KernelWatcher
	// Runner is a loop of the backend's own, run once subnet.env is written.
	Runner Runner
	// Env adds TWILL_ variables to subnet.env.
	Env EnvProvider
	// External follows a change of the external interface.
	External ExternalChanger
	// Data publishes backend data that changed after the lease was taken.
	Data DataPublisher
	// Drift and Status serve twillctl status.
	Drift  DriftReporter
	Status StatusReporter
}

// Valid reports whether a backend attached: Network is set.
func (a Attached) Valid() bool { return a.Network != nil }

// Network programs the data plane for a held lease.
type Network interface {
	// MTU is the MTU pods on this node must use.
	MTU() int
	// Reconcile makes the kernel match peers, the full set of valid peer
	// leases (the local lease excluded). It is idempotent and cheap when
	// nothing changed; it adds before it deletes, and on failure returns the
	// joined errors after applying everything it could. peers is valid only
	// during the call: the daemon reuses it.
	Reconcile(ctx context.Context, peers []subnet.Lease) error
}

// EnvProvider (Attached.Env) is offered by Networks that tell the CNI plugin more than
// the subnet and MTU: the map's keys are written to subnet.env with the
// TWILL_ prefix (the eni backend's route table and rule priorities).
type EnvProvider interface {
	Env() map[string]string
}

// Runner (Attached.Runner) is offered by Networks with a long-lived loop of their own (the
// eni backend's warm IP pool). The daemon runs it once the lease is held and
// subnet.env is written, until shutdown; an error stops the daemon.
type Runner interface {
	Run(ctx context.Context) error
}

// Updater (Attached.Updater) is offered by a Network that can apply a change of the peer
// set without being handed the whole of it, so that a lease event costs
// what changed rather than the size of the cluster. upserted are peers
// added or changed (as they are now), removed are peers gone or no longer
// valid (as they were last handed over). Between Updates the daemon still
// calls Reconcile with every peer: at start, every --resync, after a
// failure, and when the kernel drifted. Update returns an error wrapping
// ErrFullReconcile when the change touches state that spans peers (vxlan:
// a MAC two peers publish); the daemon then reconciles in full at once.
type Updater interface {
	Update(ctx context.Context, upserted, removed []subnet.Lease) error
}

// ErrFullReconcile asks the daemon for a full Reconcile.
var ErrFullReconcile = errors.New("this change needs a full reconcile")

// KernelWatcher (Attached.Watcher) is offered by a Network that can notice changes made
// behind its back (a route deleted by hand, a device removed). WatchKernel
// blocks until ctx is done and calls poke, which never blocks, whenever the
// kernel no longer matches what the Network last programmed. It calls
// watching (which never blocks either) once every one of its watches has
// subscribed and checked the kernel for changes made before (calling it
// again, after a resubscription, does nothing): the daemon reports the
// node ready only then (or after a bound), so that the checks, which read
// every object, are start-up's work and not the first lease events'.
// kernelsync.AllChecked joins several watches' first checks.
type KernelWatcher interface {
	WatchKernel(ctx context.Context, poke, watching func()) error
}

// ExternalChanger (Attached.External) is offered by a Network that programs objects
// through the external interface. When that interface changes (it came up
// again after the kernel flushed its routes, or it was deleted and
// re-created with a new index), the daemon reads it again and calls
// ExternalChanged before the next Reconcile, from the goroutine that calls
// Reconcile; the Network must use the new interface and read the kernel
// back rather than trust its record.
type ExternalChanger interface {
	ExternalChanged(ext ExternalInterface)
}

// DataPublisher (Attached.Data) is offered by a Network whose backend data can change
// after the lease was taken (vxlan picks a new VTEP MAC when another node
// publishes its own). After each Reconcile the daemon asks, and publishes
// the new BackendData and BackendV6Data in the node's lease (etcd key or
// Node annotations); nil data is published as null.
type DataPublisher interface {
	BackendData() (data, v6Data json.RawMessage, changed bool)
}

// DriftReporter (Attached.Drift) is offered by a Network that can compare, without
// changing anything, the kernel with what peers call for (twillctl status).
type DriftReporter interface {
	Drift(ctx context.Context, peers []subnet.Lease) (Drift, error)
}

// StatusReporter (Attached.Status) is offered by a Network with more to tell an
// operator than drift (twillctl status prints each line): how its devices
// are implemented, its keys, its sessions.
type StatusReporter interface {
	Status(ctx context.Context) []string
}

// Drift lists kernel objects that differ from the desired state, each as a
// line an operator can read ("route 10.244.3.0/24 via 10.0.0.3 dev eth0").
type Drift struct {
	Missing, Extra, Wrong []string
	// Objects counts the desired objects checked.
	Objects int
	// Refused lists the peers the backend will not program, each as
	// "<lease>: <why>" (host-gw: public IP not on-link; vxlan: unusable
	// backend data, a VTEP MAC not theirs alone).
	Refused []string
	// Shadowed lists the destinations a route of anyone else's holds too:
	// it takes precedence over twill's, which twill leaves alone.
	Shadowed []string
}

// Clean reports whether nothing differs.
func (d Drift) Clean() bool { return len(d.Missing)+len(d.Extra)+len(d.Wrong) == 0 }

// ExternalInterface is the node's underlay interface: where peers are
// reached and what the node publishes as its address.
type ExternalInterface struct {
	Link nl.Link
	// Addr and AddrV6 are addresses on Link used as the source for the
	// underlay; either may be invalid.
	Addr   netip.Addr
	AddrV6 netip.Addr
	// PublicIP and PublicIPv6 are published in the lease; they differ from
	// Addr when the node is behind NAT (--public-ip).
	PublicIP   netip.Addr
	PublicIPv6 netip.Addr
	// OnLink lists the prefixes directly connected through Link.
	OnLink []netip.Prefix
}

// NoAddressError is what Prepare returns when the external interface has
// no address of a family the network uses for the backend to publish. The
// address may yet come (SLAAC or DHCPv6 after boot): the daemon waits for
// it, not ready, and prepares the backend again.
type NoAddressError struct {
	Backend, Iface string
	IPv6           bool
	// Hint says what the backend needs the address for and the ways out.
	Hint string
}

func (e *NoAddressError) Error() string {
	family := "IPv4"
	if e.IPv6 {
		family = "IPv6"
	}
	return fmt.Sprintf("%s: interface %s has no %s address to publish: %s", e.Backend, e.Iface, family, e.Hint)
}

// Reachable reports whether ip is directly connected through the interface.
func (e ExternalInterface) Reachable(ip netip.Addr) bool {
	for _, p := range e.OnLink {
		if p.Contains(ip) {
			return true
		}
	}
	return false
}

// Options is what a Factory gets. Logger, Netlink, ExtIface and Config are
// always set, except that with CheckOnly only Logger and Config are.
type Options struct {
	Logger   *slog.Logger
	Netlink  Kernel
	ExtIface ExternalInterface
	// Config is the parsed net-conf.json; Config.Backend is this backend's
	// raw configuration, to be decoded strictly (see DecodeConfig).
	Config *subnet.Config
	// StateDir is a directory the backend may keep state in across
	// restarts (for example a VTEP MAC).
	StateDir string
	// FullSyncEvery bounds how long a Network may trust its own record of
	// the kernel before reading the kernel back.
	FullSyncEvery time.Duration
	// WatchedSyncEvery is that bound while a kernel watch follows the
	// objects (kernelsync's Watch: every change behind twill's back then
	// reaches the record as it happens); zero keeps FullSyncEvery.
	WatchedSyncEvery time.Duration
	Metrics          *Metrics
	// KeyRotations delivers on-demand requests to replace the node's key
	// pair (twilld: SIGUSR1), for backends that have one; nil never does.
	KeyRotations <-chan struct{}
	// CheckOnly asks the factory only to validate Config (twillctl config
	// put, on any machine): Netlink and ExtIface are unset, and it must
	// check nothing that depends on the machine it runs on.
	CheckOnly bool
}

// Metrics are the counters every backend may feed. A nil *Metrics, or a nil
// field, is valid and records nothing.
type Metrics struct {
	// DriftRepairs counts kernel objects fixed because they no longer matched
	// what twill had programmed (deleted or changed by someone else, or left
	// from before a restart).
	DriftRepairs prometheus.Counter
	// PeersUnroutable is the number of peers the backend refused to program
	// because it cannot reach them (host-gw: public IP not on-link).
	PeersUnroutable prometheus.Gauge
	// Registerer takes a backend's own metrics (nil: none are exported).
	Registerer prometheus.Registerer
}

// AddDriftRepairs records n repairs.
func (m *Metrics) AddDriftRepairs(n int) {
	if m != nil && m.DriftRepairs != nil && n > 0 {
		m.DriftRepairs.Add(float64(n))
	}
}

// SetPeersUnroutable records the current count of unroutable peers.
func (m *Metrics) SetPeersUnroutable(n int) {
	if m != nil && m.PeersUnroutable != nil {
		m.PeersUnroutable.Set(float64(n))
	}
}
