package etcd

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"golang.org/x/sync/errgroup"

	"github.com/twill-net/twill/internal/backoff"
	"github.com/twill-net/twill/subnet"
)

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
			key := recordName(string(ev.Kv.Key))
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
				e := m.parse(string(ev.Kv.Key), ev.Kv.Value, ev.Kv.Lease, ev.Kv.CreateRevision)
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
