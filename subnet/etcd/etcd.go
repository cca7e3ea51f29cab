// Package etcd is the subnet manager for clusters without Kubernetes. Each
// node allocates its own subnet in etcd v3 and watches everyone else's.
//
// Layout, under a prefix (default /twill.io/network):
//
//	<prefix>/config                 net-conf.json
//	<prefix>/subnets/<ip>-<len>     lease attributes JSON (flannel's layout)
//
// A lease key is created by a transaction that succeeds only if the key does
// not exist, and is bound to an etcd lease with a TTL that the node renews
// ahead of expiry. A key with no etcd lease is an operator's reservation: it
// never expires, is never handed to another node, and is taken by the node
// whose public IP it names. Listing leases is a single range read.
package etcd

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"go.etcd.io/etcd/client/pkg/v3/transport"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"golang.org/x/sync/errgroup"

	"github.com/twill-net/twill/internal/backoff"
	"github.com/twill-net/twill/subnet"
)

// Defaults.
const (
	DefaultPrefix      = "/twill.io/network"
	DefaultTTL         = 24 * time.Hour
	DefaultRenewMargin = time.Hour
)

// ClientOptions says how to reach etcd.
type ClientOptions struct {
	Endpoints          []string
	CAFile             string
	CertFile, KeyFile  string
	Username, Password string
	DialTimeout        time.Duration
}

// NewClient connects to etcd. The client's own logging is silenced: twill
// reports what matters through its logger.
func NewClient(o ClientOptions) (*clientv3.Client, error) {
	if len(o.Endpoints) == 0 {
		return nil, errors.New("etcd: no endpoints given (--etcd-endpoints)")
	}
	var tlsCfg *tls.Config
	if o.CAFile != "" || o.CertFile != "" || o.KeyFile != "" {
		info := transport.TLSInfo{TrustedCAFile: o.CAFile, CertFile: o.CertFile, KeyFile: o.KeyFile}
		c, err := info.ClientConfig()
		if err != nil {
			return nil, fmt.Errorf("etcd: loading TLS files: %w", err)
		}
		tlsCfg = c
	}
	if o.DialTimeout == 0 {
		o.DialTimeout = 5 * time.Second
	}
	c, err := clientv3.New(clientv3.Config{
		Endpoints:   o.Endpoints,
		TLS:         tlsCfg,
		Username:    o.Username,
		Password:    o.Password,
		DialTimeout: o.DialTimeout,
		DialOptions: clientDialOptions(),
		// Notice a connection that died without a word (a peer gone, a
		// partition) within seconds, not at the next TCP timeout.
		DialKeepAliveTime:    10 * time.Second,
		DialKeepAliveTimeout: 5 * time.Second,
		Logger:               zap.NewNop(),
	})
	if err != nil {
		return nil, fmt.Errorf("etcd: connecting to %s: %w", strings.Join(o.Endpoints, ","), err)
	}
	return c, nil
}

// Options configure a Manager. Client and Logger are required.
type Options struct {
	Client      *clientv3.Client
	Logger      *slog.Logger
	Prefix      string        // default DefaultPrefix
	TTL         time.Duration // default DefaultTTL
	RenewMargin time.Duration // default DefaultRenewMargin
	// Rand picks among free subnets; default: seeded randomly.
	Rand *rand.Rand
}

// Manager allocates this node's subnet and reports every lease.
type Manager struct {
	cli    *clientv3.Client
	log    *slog.Logger
	prefix string
	ttl    time.Duration
	margin time.Duration

	mu        sync.Mutex
	rand      *rand.Rand // guarded by mu
	own       ownLease   // guarded by mu
	listed    *listing   // guarded by mu; AcquireLease's listing, for Run to start from
	prefetch  *prefetch  // guarded by mu; a listing started ahead of AcquireLease
	connState connState  // guarded by mu

	// conflicts counts overwrites of this node's lease by another client.
	conflicts atomic.Uint64
}

type ownLease struct {
	key      string // full etcd key; "" until acquired
	lease    subnet.Lease
	attrs    []byte
	etcdID   clientv3.LeaseID // 0 for a reservation
	expires  time.Time
	reserved bool
	// pending is a value this node is writing to key, seen by the watch
	// perhaps before the write returns: its own, not another client's.
	pending []byte
}

// New returns a Manager.
func New(o Options) *Manager {
	m := &Manager{cli: o.Client, log: o.Logger.With("subnet-manager", "etcd"), prefix: strings.TrimRight(o.Prefix, "/"),
		ttl: o.TTL, margin: o.RenewMargin, rand: o.Rand}
	if m.prefix == "" {
		m.prefix = DefaultPrefix
	}
	if m.ttl <= 0 {
		m.ttl = DefaultTTL
	}
	if m.margin <= 0 || m.margin >= m.ttl {
		m.margin = min(DefaultRenewMargin, m.ttl/2)
	}
	if m.rand == nil {
		m.rand = rand.New(rand.NewPCG(rand.Uint64(), rand.Uint64()))
	}
	return m
}

// ConfigKey is where net-conf.json lives.
func (m *Manager) ConfigKey() string { return m.prefix + "/config" }

// SubnetsPrefix is the key prefix of lease keys.
func (m *Manager) SubnetsPrefix() string { return m.prefix + "/subnets/" }

// NetworkConfig reads and validates net-conf.json from etcd.
func (m *Manager) NetworkConfig(ctx context.Context) (*subnet.Config, error) {
	resp, err := m.cli.Get(ctx, m.ConfigKey())
	if err != nil {
		return nil, fmt.Errorf("reading %s from etcd: %w", m.ConfigKey(), err)
	}
	if len(resp.Kvs) == 0 {
		return nil, fmt.Errorf("reading %s from etcd: %w", m.ConfigKey(), ErrNoConfig)
	}
	cfg, err := subnet.ParseConfig(resp.Kvs[0].Value)
	if err != nil {
		return nil, fmt.Errorf("etcd key %s: %w", m.ConfigKey(), err)
	}
	return cfg, nil
}

// Errors callers may check with errors.Is.
var (
	ErrNoConfig     = errors.New("no network configuration: put net-conf.json there first")
	ErrExhausted    = errors.New("subnet range exhausted")
	ErrLeaseRevoked = errors.New("this node's lease was deleted from etcd")
)

// meta is what etcd says about a lease key besides its value.
type meta struct {
	kvRev int64 // the key's ModRevision
	etcd  int64 // etcd lease ID; 0 for a reservation
}

func (m *Manager) parse(key string, value []byte, etcdLease int64) subnet.Entry {
	name := strings.TrimPrefix(key, m.SubnetsPrefix())
	v4, v6, err := subnet.ParseSubnetKey(name)
	if err != nil {
		return subnet.Entry{Key: key, Err: err}
	}
	attrs, err := subnet.ParseLeaseAttrs(value)
	if err != nil {
		return subnet.Entry{Key: key, Err: fmt.Errorf("etcd key %s: %w", key, err), Lease: subnet.Lease{Subnet: v4, IPv6Subnet: v6}}
	}
	return subnet.Entry{Key: key, Lease: subnet.Lease{Subnet: v4, IPv6Subnet: v6, Attrs: attrs, Reserved: etcdLease == 0}}
}

// listing is a range read of every lease, at a revision: the key of set[i]
// has meta[i]. The set is handed on as it is (at start-up it is tens of
// thousands of records: no copy, no map).
type listing struct {
	set  []subnet.Entry
	meta []meta
	rev  int64
}

// list reads every lease key in one range request.
func (m *Manager) list(ctx context.Context) (*listing, error) {
	resp, err := m.cli.Get(ctx, m.SubnetsPrefix(), clientv3.WithPrefix())
	if err != nil {
		return nil, fmt.Errorf("listing %s: %w", m.SubnetsPrefix(), err)
	}
	l := &listing{set: make([]subnet.Entry, len(resp.Kvs)), meta: make([]meta, len(resp.Kvs)), rev: resp.Header.Revision}
	for i, kv := range resp.Kvs {
		l.set[i] = m.parse(string(kv.Key), kv.Value, kv.Lease)
		l.meta[i] = meta{kvRev: kv.ModRevision, etcd: kv.Lease}
	}
	return l, nil
}

// Leases lists every lease in one range read.
func (m *Manager) Leases(ctx context.Context) (subnet.Snapshot, error) {
	l, err := m.list(ctx)
	if err != nil {
		return subnet.Snapshot{}, err
	}
	return subnet.SnapshotOf(l.set), nil
}

// maxAcquireAttempts bounds allocation retries lost to other nodes' races.
const maxAcquireAttempts = 16

// AcquireLease obtains this node's subnet. In order of preference it takes
// the reservation naming attrs.PublicIP, re-binds the lease that already
// carries attrs.PublicIP (a restart), takes hint (the subnet from an earlier
// subnet.env) if it is free, or else a random free subnet.
func (m *Manager) AcquireLease(ctx context.Context, cfg *subnet.Config, attrs subnet.LeaseAttrs, hint subnet.Lease) (subnet.Lease, error) {
	value, err := json.Marshal(attrs)
	if err != nil {
		return subnet.Lease{}, fmt.Errorf("encoding lease attributes: %w", err)
	}
	for attempt := range maxAcquireAttempts {
		listed, err := m.listToAcquire(ctx, attempt == 0)
		if err != nil {
			return subnet.Lease{}, err
		}
		l, ok, err := m.tryAcquire(ctx, cfg, attrs, value, hint, listed)
		if err != nil {
			return subnet.Lease{}, err
		}
		if ok {
			// Run starts from this listing (its watch then sees our own
			// key created): one range read of every lease fewer at start.
			m.mu.Lock()
			m.listed = listed
			m.mu.Unlock()
			return l, nil
		}
		m.log.Debug("lost an allocation race; retrying")
	}
	return subnet.Lease{}, fmt.Errorf("acquiring a subnet: lost %d allocation races in a row", maxAcquireAttempts)
}

// prefetch is a listing under way or done, started by PrefetchLeases.
type prefetch struct {
	started time.Time
	done    chan struct{} // closed when l and err are set
	l       *listing
	err     error
}

// prefetchFresh is how old a prefetched listing may be for AcquireLease to
// take it. Any listing would do for correctness (taking a subnet is a
// transaction that fails on a change since, and the watch starts at the
// listing's revision), but an old one is more likely to lose a race, and
// its revision to have been compacted.
const prefetchFresh = 5 * time.Second

// PrefetchLeases starts listing the leases, for AcquireLease's first
// attempt to take instead of listing then: the daemon calls it before it
// reads the configuration, so the range read overlaps that read, the
// choice of interface and the backend's preparation. The listing stops
// with ctx.
func (m *Manager) PrefetchLeases(ctx context.Context) {
	p := &prefetch{started: time.Now(), done: make(chan struct{})}
	m.mu.Lock()
	m.prefetch = p
	m.mu.Unlock()
	go func() {
		defer close(p.done)
		p.l, p.err = m.list(ctx)
	}()
}

// listToAcquire lists the leases for an attempt to acquire one; the first
// attempt takes a fresh prefetched listing if there is one.
func (m *Manager) listToAcquire(ctx context.Context, first bool) (*listing, error) {
	m.mu.Lock()
	p := m.prefetch
	m.prefetch = nil
	m.mu.Unlock()
	if first && p != nil && time.Since(p.started) < prefetchFresh {
		select {
		case <-p.done:
			if p.err == nil {
				return p.l, nil
			}
			m.log.Debug("listing ahead failed; listing again", "err", p.err)
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	return m.list(ctx)
}

func (m *Manager) tryAcquire(ctx context.Context, cfg *subnet.Config, attrs subnet.LeaseAttrs, value []byte, hint subnet.Lease, listed *listing) (subnet.Lease, bool, error) {
	mine := func(e *subnet.Entry) bool {
		if e.Err != nil || !inRange(cfg, e.Lease) {
			return false
		}
		a := e.Lease.Attrs
		return (attrs.PublicIP.IsValid() && a.PublicIP == attrs.PublicIP) || (!attrs.PublicIP.IsValid() && a.PublicIPv6 == attrs.PublicIPv6)
	}
	// A reservation for this node, then a lease from before a restart.
	for _, reserved := range []bool{true, false} {
		for i := range listed.set {
			if e := &listed.set[i]; e.Lease.Reserved == reserved && mine(e) {
				return m.rebind(ctx, e, listed.meta[i], value)
			}
		}
	}
	used4 := map[netip.Addr]bool{}
	used6 := map[netip.Addr]bool{}
	for i := range listed.set {
		if l := &listed.set[i].Lease; l.Subnet.IsValid() {
			used4[l.Subnet.Addr()] = true
		}
		if l := &listed.set[i].Lease; l.IPv6Subnet.IsValid() {
			used6[l.IPv6Subnet.Addr()] = true
		}
	}
	var want subnet.Lease
	if hint.Subnet.IsValid() || hint.IPv6Subnet.IsValid() {
		free := (!cfg.EnableIPv4 || (inRangeV4(cfg, hint.Subnet) && !used4[hint.Subnet.Addr()])) &&
			(!cfg.EnableIPv6 || (inRangeV6(cfg, hint.IPv6Subnet) && !used6[hint.IPv6Subnet.Addr()]))
		if free {
			want = subnet.Lease{Subnet: hint.Subnet, IPv6Subnet: hint.IPv6Subnet}
			if !cfg.EnableIPv4 {
				want.Subnet = netip.Prefix{}
			}
			if !cfg.EnableIPv6 {
				want.IPv6Subnet = netip.Prefix{}
			}
		}
	}
	if !want.Subnet.IsValid() && !want.IPv6Subnet.IsValid() {
		if cfg.EnableIPv4 {
			a, err := m.pickFree(cfg.SubnetMin, cfg.SubnetMax, cfg.SubnetLen, used4)
			if err != nil {
				return subnet.Lease{}, false, fmt.Errorf("allocating from Network %s (SubnetMin %s, SubnetMax %s, SubnetLen %d): %w",
					cfg.Network, cfg.SubnetMin, cfg.SubnetMax, cfg.SubnetLen, err)
			}
			want.Subnet = netip.PrefixFrom(a, cfg.SubnetLen)
		}
		if cfg.EnableIPv6 {
			a, err := m.pickFree(cfg.IPv6SubnetMin, cfg.IPv6SubnetMax, cfg.IPv6SubnetLen, used6)
			if err != nil {
				return subnet.Lease{}, false, fmt.Errorf("allocating from IPv6Network %s: %w", cfg.IPv6Network, err)
			}
			want.IPv6Subnet = netip.PrefixFrom(a, cfg.IPv6SubnetLen)
		}
	}
	key := m.SubnetsPrefix() + want.Key()
	grant, err := m.cli.Grant(ctx, int64(m.ttl/time.Second))
	if err != nil {
		return subnet.Lease{}, false, fmt.Errorf("granting an etcd lease: %w", err)
	}
	resp, err := m.cli.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0)).
		Then(clientv3.OpPut(key, string(value), clientv3.WithLease(grant.ID))).
		Commit()
	if err != nil {
		return subnet.Lease{}, false, fmt.Errorf("creating %s: %w", key, err)
	}
	if !resp.Succeeded {
		_, _ = m.cli.Revoke(ctx, grant.ID)
		return subnet.Lease{}, false, nil
	}
	want.Attrs, _ = subnet.ParseLeaseAttrs(value)
	return m.hold(key, want, value, grant.ID, time.Duration(grant.TTL)*time.Second, false), true, nil
}

// rebind takes over an existing key with our attributes: a reservation
// stays without TTL, a lease gets a fresh etcd lease.
func (m *Manager) rebind(ctx context.Context, e *subnet.Entry, km meta, value []byte) (subnet.Lease, bool, error) {
	key := e.Key
	if l, ok := m.keep(ctx, e, km, value); ok {
		return l, true, nil
	}
	var (
		opts []clientv3.OpOption
		id   clientv3.LeaseID
		ttl  time.Duration
	)
	if !e.Lease.Reserved {
		grant, err := m.cli.Grant(ctx, int64(m.ttl/time.Second))
		if err != nil {
			return subnet.Lease{}, false, fmt.Errorf("granting an etcd lease: %w", err)
		}
		id, ttl = grant.ID, time.Duration(grant.TTL)*time.Second
		opts = append(opts, clientv3.WithLease(id))
	}
	resp, err := m.cli.Txn(ctx).
		If(clientv3.Compare(clientv3.ModRevision(key), "=", km.kvRev)).
		Then(clientv3.OpPut(key, string(value), opts...)).
		Commit()
	if err != nil {
		return subnet.Lease{}, false, fmt.Errorf("updating %s: %w", key, err)
	}
	if !resp.Succeeded {
		if id != 0 {
			_, _ = m.cli.Revoke(ctx, id)
		}
		return subnet.Lease{}, false, nil
	}
	if km.etcd != 0 && !e.Lease.Reserved {
		// The previous etcd lease now holds nothing; let it go now rather
		// than at its expiry.
		_, _ = m.cli.Revoke(ctx, clientv3.LeaseID(km.etcd))
	}
	l := e.Lease
	l.Attrs, _ = subnet.ParseLeaseAttrs(value)
	m.log.Info("reusing subnet", "subnet", l.String(), "reservation", l.Reserved)
	return m.hold(key, l, value, id, ttl, l.Reserved), true, nil
}

// keep holds a key that already says what this node would write, without
// writing it: a node's restart sends no other node a lease event. A
// reservation is held as it is, a lease by renewing its etcd lease; keep
// reports false when the key says something else or its etcd lease is
// gone or of another TTL, and the key must be written. The watch starts
// from the listing the key was read in, so a key deleted since is seen.
func (m *Manager) keep(ctx context.Context, e *subnet.Entry, km meta, value []byte) (subnet.Lease, bool) {
	want, err := subnet.ParseLeaseAttrs(value)
	if err != nil || e.Err != nil || !e.Lease.Attrs.Equal(want) {
		return subnet.Lease{}, false
	}
	l := e.Lease
	if l.Reserved {
		m.log.Info("reusing subnet, unchanged", "subnet", l.String(), "reservation", true)
		return m.hold(e.Key, l, value, 0, 0, true), true
	}
	resp, err := m.cli.KeepAliveOnce(ctx, clientv3.LeaseID(km.etcd))
	if err != nil || resp.TTL != int64(m.ttl/time.Second) {
		return subnet.Lease{}, false
	}
	m.log.Info("reusing subnet, unchanged", "subnet", l.String(), "reservation", false)
	return m.hold(e.Key, l, value, clientv3.LeaseID(km.etcd), time.Duration(resp.TTL)*time.Second, false), true
}

func (m *Manager) hold(key string, l subnet.Lease, value []byte, id clientv3.LeaseID, ttl time.Duration, reserved bool) subnet.Lease {
	if !reserved {
		l.Expiration = time.Now().Add(ttl)
	}
	m.mu.Lock()
	m.own = ownLease{key: key, lease: l, attrs: value, etcdID: id, expires: l.Expiration, reserved: reserved}
	m.mu.Unlock()
	return l
}

func inRange(cfg *subnet.Config, l subnet.Lease) bool {
	return (!cfg.EnableIPv4 || inRangeV4(cfg, l.Subnet)) && (!cfg.EnableIPv6 || inRangeV6(cfg, l.IPv6Subnet))
}

func inRangeV4(cfg *subnet.Config, p netip.Prefix) bool {
	return cfg.Contains(p) && !p.Addr().Less(cfg.SubnetMin) && !cfg.SubnetMax.Less(p.Addr())
}

func inRangeV6(cfg *subnet.Config, p netip.Prefix) bool {
	return cfg.ContainsV6(p) && !p.Addr().Less(cfg.IPv6SubnetMin) && !cfg.IPv6SubnetMax.Less(p.Addr())
}

// scanLimit is the largest range searched exhaustively; larger ranges are
// probed at random, which finds a free subnet quickly unless nearly full.
const (
	scanLimit   = 1 << 20
	probeLimits = 4096
)

func (m *Manager) pickFree(minA, maxA netip.Addr, bits int, used map[netip.Addr]bool) (netip.Addr, error) {
	n := subnetCount(minA, maxA, bits)
	m.mu.Lock()
	defer m.mu.Unlock()
	// A few random probes find a free subnet at once unless the range is
	// nearly full (a /8 of /24s is 65,536 subnets: scanning them all took
	// 20 ms of every start).
	for range min(n, 64) {
		if a := subnet.NthSubnet(minA, m.rand.Uint64N(n), bits); !used[a] {
			return a, nil
		}
	}
	if n <= scanLimit {
		free := uint64(0)
		for i := range n {
			if !used[subnet.NthSubnet(minA, i, bits)] {
				free++
			}
		}
		if free == 0 {
			return netip.Addr{}, fmt.Errorf("%w: all %d /%d subnets are leased or reserved", ErrExhausted, n, bits)
		}
		k := m.rand.Uint64N(free)
		for i := range n {
			if a := subnet.NthSubnet(minA, i, bits); !used[a] {
				if k == 0 {
					return a, nil
				}
				k--
			}
		}
	}
	for range probeLimits {
		a := subnet.NthSubnet(minA, m.rand.Uint64N(n), bits)
		if !used[a] {
			return a, nil
		}
	}
	return netip.Addr{}, fmt.Errorf("%w: no free /%d found in %d random probes", ErrExhausted, bits, probeLimits)
}

func subnetCount(minA, maxA netip.Addr, bits int) uint64 {
	c := subnet.Config{SubnetMin: minA, SubnetMax: maxA, SubnetLen: bits}
	return c.SubnetCount()
}

// Run watches every lease and calls publish with the full set after the
// first listing (and any relisting), and with what changed after every
// batch of watch events; it also renews this node's lease. It blocks until ctx is done, and returns ErrLeaseRevoked if
// this node's lease key is deleted (flannel does the same: a node whose
// lease an operator removed must not go on using the subnet).
func (m *Manager) Run(ctx context.Context, publish func(subnet.Change)) error {
	g, ctx := errgroup.WithContext(ctx)
	g.Go(func() error { return m.watch(ctx, publish) })
	g.Go(func() error { return m.renew(ctx) })
	return g.Wait()
}

func (m *Manager) watch(ctx context.Context, publish func(subnet.Change)) error {
	var (
		listed bool
		rev    int64
		// At most a second: a watch that failed while etcd was away
		// (no leader while it shut down or started) must not sleep long
		// past its return, deaf to lease changes. A retry is one Watch
		// call that waits for the connection.
		bo = backoff.Backoff{Min: 100 * time.Millisecond, Max: time.Second}
	)
	for ctx.Err() == nil {
		if !listed {
			l, err := m.takeListing(ctx)
			if err != nil {
				if ctx.Err() != nil {
					return nil
				}
				m.log.Warn("listing leases failed; retrying", "err", err)
				backoff.Sleep(ctx, bo.Next())
				continue
			}
			// The daemon keeps the set; the manager keeps only the
			// revision it follows.
			listed, rev = true, l.rev
			publish(subnet.Change{Full: true, Set: l.set})
		}
		wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
		wch := m.cli.Watch(wctx, m.SubnetsPrefix(), clientv3.WithPrefix(), clientv3.WithRev(rev+1), clientv3.WithProgressNotify())
		relist, err := m.consume(ctx, wch, &rev, publish, &bo)
		cancel()
		if err != nil {
			return err
		}
		if ctx.Err() != nil {
			return nil
		}
		if relist {
			m.log.Info("watch revision compacted; listing leases again", "revision", rev)
			listed = false
			continue
		}
		backoff.Sleep(ctx, bo.Next())
	}
	return nil
}

// consume applies watch responses until the channel ends. It reports
// whether a fresh listing is needed (compaction).
func (m *Manager) consume(ctx context.Context, wch clientv3.WatchChan, rev *int64, publish func(subnet.Change), bo *backoff.Backoff) (bool, error) {
	for resp := range wch {
		if resp.CompactRevision != 0 || errors.Is(resp.Err(), rpctypes.ErrCompacted) {
			return true, nil
		}
		if err := resp.Err(); err != nil {
			m.log.Warn("lease watch failed; resuming", "revision", *rev, "err", err)
			return false, nil
		}
		bo.Reset()
		if resp.IsProgressNotify() {
			*rev = resp.Header.Revision
			continue
		}
		m.mu.Lock()
		ownKey := m.own.key
		m.mu.Unlock()
		// Each key's state after the batch, whatever happened to it within.
		batch := make(map[string]*subnet.Entry, len(resp.Events))
		touched := make([]string, 0, len(resp.Events))
		for _, ev := range resp.Events {
			key := string(ev.Kv.Key)
			if _, seen := batch[key]; !seen {
				touched = append(touched, key)
			}
			switch ev.Type {
			case clientv3.EventTypeDelete:
				batch[key] = nil
				if key == ownKey {
					return false, fmt.Errorf("%w (%s)", ErrLeaseRevoked, key)
				}
			default:
				e := m.parse(key, ev.Kv.Value, ev.Kv.Lease)
				batch[key] = &e
				if key == ownKey {
					m.checkOwn(ctx, ev.Kv)
				}
			}
			*rev = ev.Kv.ModRevision
		}
		publish(changeOf(batch, touched))
	}
	return false, nil
}

// checkOwn looks at a write to this node's own lease key: one this node
// did not make (another client with the prefix's credentials, which etcd's
// RBAC cannot tell from this node's) is counted, said loudly, and undone,
// unless the key changed again since.
func (m *Manager) checkOwn(ctx context.Context, kv *mvccpb.KeyValue) {
	m.mu.Lock()
	own := m.own
	m.mu.Unlock()
	if bytes.Equal(kv.Value, own.attrs) || bytes.Equal(kv.Value, own.pending) {
		return
	}
	m.conflicts.Add(1)
	found := "unparsable"
	if a, err := subnet.ParseLeaseAttrs(kv.Value); err == nil {
		found = a.PublicIP.String()
		if a.PublicIPv6.IsValid() {
			found += " " + a.PublicIPv6.String()
		}
	}
	m.log.Error("this node's lease was overwritten by another client (etcd's RBAC cannot keep nodes off each other's leases); writing it back",
		"key", own.key, "found_public_ip", found, "want_public_ip", own.lease.Attrs.PublicIP, "revision", kv.ModRevision)
	var opts []clientv3.OpOption
	if !own.reserved {
		opts = append(opts, clientv3.WithLease(own.etcdID))
	}
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	_, err := m.cli.Txn(wctx).
		If(clientv3.Compare(clientv3.ModRevision(own.key), "=", kv.ModRevision)).
		Then(clientv3.OpPut(own.key, string(own.attrs), opts...)).
		Commit()
	if err != nil {
		m.log.Warn("writing this node's lease back failed; the next change to it is checked again", "key", own.key, "err", err)
	}
}

// OwnLeaseConflicts is how many times another client overwrote this
// node's lease.
func (m *Manager) OwnLeaseConflicts() uint64 { return m.conflicts.Load() }

// takeListing returns the listing AcquireLease made, once, or a new one.
func (m *Manager) takeListing(ctx context.Context) (*listing, error) {
	m.mu.Lock()
	l := m.listed
	m.listed = nil
	m.mu.Unlock()
	if l != nil {
		return l, nil
	}
	return m.list(ctx)
}

// changeOf is the Change a batch of events makes: touched in order, each
// key's last state (nil: deleted).
func changeOf(batch map[string]*subnet.Entry, touched []string) subnet.Change {
	var c subnet.Change
	for _, key := range touched {
		if e := batch[key]; e != nil {
			c.Set = append(c.Set, *e)
		} else {
			c.Deleted = append(c.Deleted, key)
		}
	}
	return c
}

// renew keeps this node's etcd lease alive, renewing it RenewMargin before
// it would expire. If etcd lost the lease (expired while unreachable), the
// key is created again with the same subnet.
func (m *Manager) renew(ctx context.Context) error {
	bo := backoff.Backoff{Min: 100 * time.Millisecond, Max: 10 * time.Second}
	for {
		m.mu.Lock()
		own := m.own
		m.mu.Unlock()
		if own.key == "" || own.reserved {
			<-ctx.Done()
			return nil
		}
		if !backoff.Sleep(ctx, time.Until(own.expires.Add(-m.margin))) {
			return nil
		}
		resp, err := m.cli.KeepAliveOnce(ctx, own.etcdID)
		switch {
		case err == nil:
			bo.Reset()
			m.mu.Lock()
			m.own.expires = time.Now().Add(time.Duration(resp.TTL) * time.Second)
			m.own.lease.Expiration = m.own.expires
			m.mu.Unlock()
			m.log.Debug("renewed lease", "key", own.key, "ttl", resp.TTL)
		case errors.Is(err, rpctypes.ErrLeaseNotFound):
			m.log.Warn("etcd lost this node's lease; creating it again", "key", own.key)
			if err := m.recreate(ctx, own); err != nil {
				return err
			}
		default:
			if ctx.Err() != nil {
				return nil
			}
			d := bo.Next()
			m.log.Warn("renewing lease failed; retrying", "key", own.key, "in", d, "err", err)
			m.mu.Lock()
			m.own.expires = time.Now().Add(m.margin + d) // retry after d
			m.mu.Unlock()
		}
	}
}

func (m *Manager) recreate(ctx context.Context, own ownLease) error {
	grant, err := m.cli.Grant(ctx, int64(m.ttl/time.Second))
	if err != nil {
		return fmt.Errorf("granting an etcd lease: %w", err)
	}
	resp, err := m.cli.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(own.key), "=", 0)).
		Then(clientv3.OpPut(own.key, string(own.attrs), clientv3.WithLease(grant.ID))).
		Commit()
	if err != nil {
		return fmt.Errorf("re-creating %s: %w", own.key, err)
	}
	if !resp.Succeeded {
		return fmt.Errorf("re-creating %s: another node took the subnet: %w", own.key, ErrLeaseRevoked)
	}
	m.hold(own.key, own.lease, own.attrs, grant.ID, time.Duration(grant.TTL)*time.Second, false)
	return nil
}

// UpdateBackendData publishes new backend data in this node's lease key
// (a backend that had to change it, such as vxlan taking a new VTEP MAC),
// keeping the key's etcd lease.
func (m *Manager) UpdateBackendData(ctx context.Context, data, v6Data json.RawMessage) error {
	m.mu.Lock()
	own := m.own
	m.mu.Unlock()
	if own.key == "" {
		return errors.New("no lease held")
	}
	attrs, err := subnet.ParseLeaseAttrs(own.attrs)
	if err != nil {
		return err
	}
	attrs.BackendData, attrs.BackendV6Data = data, v6Data
	value, err := json.Marshal(attrs)
	if err != nil {
		return err
	}
	var opts []clientv3.OpOption
	if !own.reserved {
		opts = append(opts, clientv3.WithLease(own.etcdID))
	}
	m.mu.Lock()
	m.own.pending = value
	m.mu.Unlock()
	resp, err := m.cli.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(own.key), ">", 0)).
		Then(clientv3.OpPut(own.key, string(value), opts...)).
		Commit()
	if err != nil {
		return fmt.Errorf("updating %s: %w", own.key, err)
	}
	if !resp.Succeeded {
		return fmt.Errorf("updating %s: %w", own.key, ErrLeaseRevoked)
	}
	m.mu.Lock()
	m.own.attrs, m.own.lease.Attrs = value, attrs
	m.mu.Unlock()
	return nil
}

// ReleaseLease deletes the lease key of a subnet pair: the node gives its
// subnet back (twilld cleanup --release-lease, twillctl leases delete), and
// every other node removes its routes to it at once.
func ReleaseLease(ctx context.Context, cli *clientv3.Client, prefix string, v4, v6 netip.Prefix) error {
	key := strings.TrimRight(prefix, "/") + "/subnets/" + subnet.SubnetKey(v4, v6)
	resp, err := cli.Delete(ctx, key)
	if err != nil {
		return fmt.Errorf("deleting %s: %w", key, err)
	}
	if resp.Deleted == 0 {
		return fmt.Errorf("deleting %s: no such lease", key)
	}
	return nil
}
