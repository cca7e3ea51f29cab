package etcd

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/twill-net/twill/internal/backoff"
	"github.com/twill-net/twill/subnet"
)

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
	l := own.lease
	l.Since = resp.Header.Revision // younger now than every lease created meanwhile
	m.hold(own.key, l, own.attrs, grant.ID, time.Duration(grant.TTL)*time.Second, false)
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
