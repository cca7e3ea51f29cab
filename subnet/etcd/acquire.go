package etcd

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/twill-net/twill/subnet"
)

// AcquireLease obtains this node's subnet. In order of preference it takes
// the reservation naming attrs.PublicIP, re-binds the lease that already
// carries attrs.PublicIP (a restart), takes hint (the subnet from an earlier
// subnet.env) if it is free, or else a random free subnet.
func (m *Manager) AcquireLease(ctx context.Context, cfg *subnet.Config, attrs subnet.LeaseAttrs, hint subnet.Lease) (subnet.Lease, error) {
	// twilld's lease says so: beside flanneld on its prefix, peers and
	// twillctl tell the nodes already switched from those still on flannel.
	attrs.NodeAgent = subnet.NodeAgentTwill
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
	return m.take(ctx, want, value)
}

// take creates want's key, bound to a new etcd lease, if no other node
// holds its subnets, and says whether it did.
func (m *Manager) take(ctx context.Context, want subnet.Lease, value []byte) (subnet.Lease, bool, error) {
	key := m.SubnetsPrefix() + want.Key()
	grant, err := m.cli.Grant(ctx, int64(m.ttl/time.Second))
	if err != nil {
		return subnet.Lease{}, false, fmt.Errorf("granting an etcd lease: %w", err)
	}
	resp, err := m.cli.Txn(ctx).
		If(free(m.SubnetsPrefix(), want, key)...).
		Then(clientv3.OpPut(key, string(value), clientv3.WithLease(grant.ID))).
		Commit()
	if err != nil {
		return subnet.Lease{}, false, fmt.Errorf("creating %s: %w", key, err)
	}
	if !resp.Succeeded {
		_, _ = m.cli.Revoke(ctx, grant.ID)
		return subnet.Lease{}, false, nil
	}
	if want.Subnet.IsValid() && want.IPv6Subnet.IsValid() {
		// No comparison covers the IPv6 subnet, which ends the key (free):
		// of two nodes that took it, the later yields.
		taken, err := m.takenBefore(ctx, want.IPv6Subnet, key, resp.Header.Revision)
		if err != nil || taken {
			_, _ = m.cli.Revoke(ctx, grant.ID) // deletes the key
			return subnet.Lease{}, false, err
		}
	}
	want.Attrs, _ = subnet.ParseLeaseAttrs(value)
	want.Since = resp.Header.Revision // the transaction created the key
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

// takenBefore says whether a lease other than key, created before
// revision rev, holds IPv6 subnet v6.
func (m *Manager) takenBefore(ctx context.Context, v6 netip.Prefix, key string, rev int64) (bool, error) {
	resp, err := m.cli.Get(ctx, m.SubnetsPrefix(), clientv3.WithPrefix(), clientv3.WithKeysOnly())
	if err != nil {
		return false, fmt.Errorf("checking that no other lease took %s: %w", v6, err)
	}
	for _, kv := range resp.Kvs {
		if string(kv.Key) == key || kv.CreateRevision >= rev {
			continue
		}
		if _, other, err := subnet.ParseSubnetKey(strings.TrimPrefix(string(kv.Key), m.SubnetsPrefix())); err == nil && other == v6 {
			return true, nil
		}
	}
	return false, nil
}

// free is the condition under which taking want (registry key key) cannot
// take another node's subnet: no key holds want's pair, nor want's IPv4
// subnet paired with another IPv6 one. A dual-stack key names both subnets
// ("10.244.1.0-24&fd00::-64"), so that key alone being new would let two
// nodes that picked the same IPv4 subnet, each with its own IPv6 one, both
// hold it (seen in a 6.12 kernel's lab, 2026-11-29: each then refused the
// other's lease and routed to no peer). The IPv4 subnet leads every key
// that holds it, so a range comparison covers it. The IPv6 subnet ends a
// dual-stack key: take checks it after the write (takenBefore).
func free(prefix string, want subnet.Lease, key string) []clientv3.Cmp {
	cmps := []clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(key), "=", 0)}
	if want.Subnet.IsValid() {
		v4 := prefix + subnet.SubnetKey(want.Subnet, netip.Prefix{})
		// The key of the IPv4 subnet alone, and every key it leads with "&".
		cmps = append(cmps, clientv3.Compare(clientv3.CreateRevision(v4), "=", 0),
			clientv3.Compare(clientv3.CreateRevision(v4+"&"), "=", 0).WithPrefix())
	}
	return cmps
}
