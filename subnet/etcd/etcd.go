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
	"context"
	"crypto/sha256"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.etcd.io/etcd/client/pkg/v3/transport"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/twill-net/twill/subnet"
)

// Defaults.
const (
	DefaultPrefix = "/twill.io/network"
	// FlannelPrefix is flanneld's, which twilld runs on while a flannel
	// cluster is switched to twill: there, a lease without NodeAgent is a
	// node still on flannel.
	FlannelPrefix      = "/coreos.com/network"
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

// What a lease record may be. Anyone holding a node's etcd credentials can
// write keys and values of any size (etcd takes 1.5 MiB a request); a
// record over these is refused before it is parsed, and nothing of it is
// kept but a bounded name. A lease's value is a few hundred bytes, its key
// under a hundred.
const (
	MaxKeyBytes   = 512
	MaxValueBytes = 8 << 10
)

// recordName is how a lease key is named in entries, refusals and logs:
// the key itself, or for one over MaxKeyBytes its first 64 bytes and a
// digest of the rest (a watch's delete of it finds the same name).
func recordName(key string) string {
	if len(key) <= MaxKeyBytes {
		return key
	}
	sum := sha256.Sum256([]byte(key))
	return fmt.Sprintf("%s…(%d bytes, sha256 %x)", strings.ToValidUTF8(key[:64], "?"), len(key), sum[:8])
}

// parse reads one lease key: its value, the etcd lease it is bound to (0:
// a reservation) and the revision that created it (the lease's Since).
func (m *Manager) parse(key string, value []byte, etcdLease, created int64) subnet.Entry {
	if len(key) > MaxKeyBytes {
		return subnet.Entry{Key: recordName(key), Err: fmt.Errorf("etcd key %q: %d bytes, over the %d a lease key may have", recordName(key), len(key), MaxKeyBytes)}
	}
	name := strings.TrimPrefix(key, m.SubnetsPrefix())
	v4, v6, err := subnet.ParseSubnetKey(name)
	if err != nil {
		return subnet.Entry{Key: key, Err: err}
	}
	if len(value) > MaxValueBytes {
		return subnet.Entry{Key: key, Err: fmt.Errorf("etcd key %s: a value of %d bytes, over the %d a lease may have", key, len(value), MaxValueBytes),
			Lease: subnet.Lease{Subnet: v4, IPv6Subnet: v6, Since: created}}
	}
	attrs, err := subnet.ParseLeaseAttrs(value)
	if err != nil {
		return subnet.Entry{Key: key, Err: fmt.Errorf("etcd key %s: %w", key, err), Lease: subnet.Lease{Subnet: v4, IPv6Subnet: v6, Since: created}}
	}
	return subnet.Entry{Key: key, Lease: subnet.Lease{Subnet: v4, IPv6Subnet: v6, Attrs: attrs, Reserved: etcdLease == 0, Since: created}}
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
		l.set[i] = m.parse(string(kv.Key), kv.Value, kv.Lease, kv.CreateRevision)
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
