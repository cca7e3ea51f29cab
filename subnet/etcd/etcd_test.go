package etcd

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/netip"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/twill-net/twill/lab/etcdserver"
	"github.com/twill-net/twill/subnet"
)

var endpoint string

func TestMain(m *testing.M) {
	os.Exit(runWithEtcd(m))
}

// runWithEtcd starts one real etcd for the package; tests isolate
// themselves by key prefix.
func runWithEtcd(m *testing.M) int {
	dir, err := os.MkdirTemp("", "twill-etcd-test")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	port, err := etcdserver.FreePort()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	endpoint = fmt.Sprintf("http://127.0.0.1:%d", port)
	srv, err := etcdserver.Start(context.Background(), etcdserver.Config{Dir: dir, ClientURLs: []string{endpoint}, LogLevel: "fatal"})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer srv.Close()
	return m.Run()
}

func client(t *testing.T) *clientv3.Client {
	t.Helper()
	c, err := NewClient(ClientOptions{Endpoints: []string{endpoint}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

func testPrefix(t *testing.T) string {
	return "/test/" + strings.NewReplacer("/", "_", " ", "_").Replace(t.Name())
}

func newManager(t *testing.T, c *clientv3.Client, seed uint64) *Manager {
	return New(Options{Client: c, Logger: quiet, Prefix: testPrefix(t), Rand: rand.New(rand.NewPCG(seed, 1))})
}

func config(t *testing.T, c *clientv3.Client, m *Manager, conf string) *subnet.Config {
	t.Helper()
	if _, err := c.Put(context.Background(), m.ConfigKey(), conf); err != nil {
		t.Fatal(err)
	}
	cfg, err := m.NetworkConfig(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

func attrs(ip string) subnet.LeaseAttrs {
	return subnet.LeaseAttrs{PublicIP: netip.MustParseAddr(ip), BackendType: "host-gw"}
}

func TestAcquireAllocatesDistinctSubnetsBoundToALease(t *testing.T) {
	c := client(t)
	ctx := context.Background()
	m1, m2 := newManager(t, c, 1), newManager(t, c, 1) // same seed: same first pick, so the second must lose the race and retry
	cfg := config(t, c, m1, `{"Network":"10.50.0.0/16","SubnetMin":"10.50.10.0","SubnetMax":"10.50.12.0","Backend":{"Type":"host-gw"}}`)
	l1, err := m1.AcquireLease(ctx, cfg, attrs("192.168.9.1"), subnet.Lease{})
	if err != nil {
		t.Fatal(err)
	}
	l2, err := m2.AcquireLease(ctx, cfg, attrs("192.168.9.2"), subnet.Lease{})
	if err != nil {
		t.Fatal(err)
	}
	if l1.Subnet == l2.Subnet {
		t.Fatalf("two nodes got %s", l1.Subnet)
	}
	for _, l := range []subnet.Lease{l1, l2} {
		if !inRangeV4(cfg, l.Subnet) {
			t.Errorf("subnet %s outside SubnetMin..SubnetMax", l.Subnet)
		}
		key := m1.SubnetsPrefix() + strings.ReplaceAll(l.Subnet.String(), "/", "-")
		resp, err := c.Get(ctx, key)
		if err != nil || len(resp.Kvs) != 1 {
			t.Fatalf("key %s not in etcd: %v", key, err)
		}
		var raw map[string]any
		if err := json.Unmarshal(resp.Kvs[0].Value, &raw); err != nil || raw["BackendType"] != "host-gw" || raw["PublicIP"] != l.Attrs.PublicIP.String() {
			t.Errorf("value %s is not flannel-shaped lease JSON", resp.Kvs[0].Value)
		}
		ttl, err := c.TimeToLive(ctx, clientv3.LeaseID(resp.Kvs[0].Lease))
		if err != nil || ttl.TTL < int64(DefaultTTL/time.Second)-60 {
			t.Errorf("key %s: etcd lease TTL %v (%v), want about 24h", key, ttl, err)
		}
	}
}

// TestAcquireDualStackLosesARaceForItsIPv4Subnet: two dual-stack nodes
// that pick the same IPv4 subnet, each with its own IPv6 one, write two
// different keys; the second must lose the race rather than hold the
// first's IPv4 subnet.
func TestAcquireDualStackLosesARaceForItsIPv4Subnet(t *testing.T) {
	c := client(t)
	ctx := context.Background()
	m1, m2 := newManager(t, c, 1), newManager(t, c, 2)
	cfg := config(t, c, m1, `{"Network":"10.51.0.0/16","EnableIPv6":true,"IPv6Network":"fd00:51::/48","Backend":{"Type":"host-gw"}}`)
	// m2 chooses from a listing taken before m1's lease exists.
	stale, err := m2.list(ctx)
	if err != nil {
		t.Fatal(err)
	}
	hint := func(v6 string) subnet.Lease {
		return subnet.Lease{Subnet: netip.MustParsePrefix("10.51.7.0/24"), IPv6Subnet: netip.MustParsePrefix(v6)}
	}
	l1, err := m1.AcquireLease(ctx, cfg, attrs("192.168.9.1"), hint("fd00:51:0:1::/64"))
	if err != nil || l1.Subnet != hint("fd00:51:0:1::/64").Subnet {
		t.Fatalf("first node: %v, %v", l1, err)
	}
	a2 := attrs("192.168.9.2")
	value, _ := json.Marshal(a2)
	l2, ok, err := m2.tryAcquire(ctx, cfg, a2, value, hint("fd00:51:0:2::/64"), stale)
	if err != nil {
		t.Fatal(err)
	}
	if ok {
		t.Fatalf("the second node holds %s too, beside %s", l2, l1)
	}
	// Its next attempt lists again and takes another IPv4 subnet.
	l2, err = m2.AcquireLease(ctx, cfg, a2, hint("fd00:51:0:2::/64"))
	if err != nil || l2.Subnet == l1.Subnet {
		t.Fatalf("second node: %v, %v; the first holds %s", l2, err, l1)
	}
}

// A listing read ahead of AcquireLease can be out of date when it is
// used: a subnet another node took in between is not taken twice.
func TestAcquireWithStalePrefetch(t *testing.T) {
	c := client(t)
	ctx := context.Background()
	m1, m2 := newManager(t, c, 1), newManager(t, c, 1) // same seed: the same first pick
	cfg := config(t, c, m1, `{"Network":"10.50.0.0/16","SubnetMin":"10.50.10.0","SubnetMax":"10.50.12.0","Backend":{"Type":"host-gw"}}`)
	m1.PrefetchLeases(ctx)
	m1.mu.Lock()
	p := m1.prefetch
	m1.mu.Unlock()
	<-p.done // the listing is read before the other node takes its subnet
	l2, err := m2.AcquireLease(ctx, cfg, attrs("192.168.9.2"), subnet.Lease{})
	if err != nil {
		t.Fatal(err)
	}
	l1, err := m1.AcquireLease(ctx, cfg, attrs("192.168.9.1"), subnet.Lease{})
	if err != nil {
		t.Fatal(err)
	}
	if l1.Subnet == l2.Subnet {
		t.Fatalf("two nodes got %s", l1.Subnet)
	}
}

// A listing ahead that failed (here: stopped before it began) leaves
// AcquireLease to list for itself.
func TestAcquireAfterFailedPrefetch(t *testing.T) {
	c := client(t)
	m := newManager(t, c, 3)
	cfg := config(t, c, m, `{"Network":"10.50.0.0/16","Backend":{"Type":"host-gw"}}`)
	stopped, cancel := context.WithCancel(context.Background())
	cancel()
	m.PrefetchLeases(stopped)
	l, err := m.AcquireLease(context.Background(), cfg, attrs("192.168.9.1"), subnet.Lease{})
	if err != nil || !cfg.Network.Contains(l.Subnet.Addr()) {
		t.Fatalf("lease %v, %v; want a subnet of %s", l, err, cfg.Network)
	}
}

func TestAcquireReusesSubnetAfterRestart(t *testing.T) {
	c := client(t)
	ctx := context.Background()
	m := newManager(t, c, 2)
	cfg := config(t, c, m, `{"Network":"10.51.0.0/16","Backend":{"Type":"host-gw"}}`)
	first, err := m.AcquireLease(ctx, cfg, attrs("192.168.9.1"), subnet.Lease{})
	if err != nil {
		t.Fatal(err)
	}
	key := m.SubnetsPrefix() + first.Key()
	before := getKV(t, c, key)
	again, err := newManager(t, c, 99).AcquireLease(ctx, cfg, attrs("192.168.9.1"), subnet.Lease{})
	if err != nil {
		t.Fatal(err)
	}
	if again.Subnet != first.Subnet {
		t.Fatalf("restart with the same public IP got %s, had %s", again.Subnet, first.Subnet)
	}
	// Nothing changed: the key is not written again (no lease event for
	// every other node), and its etcd lease is renewed, not replaced.
	if after := getKV(t, c, key); after.ModRevision != before.ModRevision || after.Lease != before.Lease {
		t.Fatalf("a restart with unchanged attributes rewrote %s: revision %d -> %d, etcd lease %x -> %x",
			key, before.ModRevision, after.ModRevision, before.Lease, after.Lease)
	}
	// Changed attributes are written, under a fresh etcd lease.
	changed := attrs("192.168.9.1")
	changed.BackendData = json.RawMessage(`{"x":1}`)
	if _, err := newManager(t, c, 98).AcquireLease(ctx, cfg, changed, subnet.Lease{}); err != nil {
		t.Fatal(err)
	}
	if after := getKV(t, c, key); after.ModRevision == before.ModRevision || !strings.Contains(string(after.Value), `"x":1`) || after.Lease == before.Lease {
		t.Fatalf("a restart with new backend data left %s as it was: %s (etcd lease %x)", key, after.Value, after.Lease)
	}
	// A node whose public IP changed finds its subnet through subnet.env.
	hint := subnet.Lease{Subnet: netip.MustParsePrefix("10.51.77.0/24")}
	l, err := newManager(t, c, 3).AcquireLease(ctx, cfg, attrs("192.168.9.7"), hint)
	if err != nil || l.Subnet != hint.Subnet {
		t.Fatalf("with subnet.env hint %s got %s (%v)", hint.Subnet, l.Subnet, err)
	}
	// A hint held by someone else is not taken.
	l, err = newManager(t, c, 4).AcquireLease(ctx, cfg, attrs("192.168.9.8"), hint)
	if err != nil || l.Subnet == hint.Subnet {
		t.Fatalf("a taken hint was handed out again: %s (%v)", l.Subnet, err)
	}
}

func TestReservationsAndExhaustion(t *testing.T) {
	c := client(t)
	ctx := context.Background()
	m := newManager(t, c, 5)
	cfg := config(t, c, m, `{"Network":"10.52.0.0/16","SubnetMin":"10.52.1.0","SubnetMax":"10.52.2.0","Backend":{"Type":"host-gw"}}`)
	// The operator reserves 10.52.1.0/24 for 192.168.9.50: a key without TTL.
	resKey := m.SubnetsPrefix() + "10.52.1.0-24"
	if _, err := c.Put(ctx, resKey, `{"PublicIP":"192.168.9.50","BackendType":"host-gw","NodeAgent":"twill"}`); err != nil {
		t.Fatal(err)
	}
	other, err := m.AcquireLease(ctx, cfg, attrs("192.168.9.1"), subnet.Lease{Subnet: netip.MustParsePrefix("10.52.1.0/24")})
	if err != nil {
		t.Fatal(err)
	}
	if other.Subnet.String() != "10.52.2.0/24" {
		t.Fatalf("another node got %s; the reservation must not be handed out", other.Subnet)
	}
	_, err = newManager(t, c, 6).AcquireLease(ctx, cfg, attrs("192.168.9.2"), subnet.Lease{})
	if !errors.Is(err, ErrExhausted) || !strings.Contains(err.Error(), "10.52.0.0/16") || !strings.Contains(err.Error(), "SubnetMax 10.52.2.0") {
		t.Fatalf("error %v: want ErrExhausted naming the Network and range", err)
	}
	before := getKV(t, c, resKey)
	owner, err := newManager(t, c, 7).AcquireLease(ctx, cfg, attrs("192.168.9.50"), subnet.Lease{})
	if err != nil || owner.Subnet.String() != "10.52.1.0/24" || !owner.Reserved {
		t.Fatalf("the reserved node got %+v (%v)", owner, err)
	}
	resp, err := c.Get(ctx, resKey)
	if err != nil || len(resp.Kvs) != 1 || resp.Kvs[0].Lease != 0 {
		t.Fatalf("taking a reservation must keep it a reservation (no TTL): %+v %v", resp, err)
	}
	if resp.Kvs[0].ModRevision != before.ModRevision {
		t.Fatalf("taking a reservation that already says what the node would write rewrote it (revision %d -> %d)", before.ModRevision, resp.Kvs[0].ModRevision)
	}
}

func TestNetworkConfigErrors(t *testing.T) {
	c := client(t)
	m := newManager(t, c, 8)
	if _, err := m.NetworkConfig(context.Background()); !errors.Is(err, ErrNoConfig) || !strings.Contains(err.Error(), m.ConfigKey()) {
		t.Fatalf("missing config: %v", err)
	}
	if _, err := c.Put(context.Background(), m.ConfigKey(), `{"Network":"10.0.0.0/16","Bakend":{}}`); err != nil {
		t.Fatal(err)
	}
	if _, err := m.NetworkConfig(context.Background()); err == nil || !strings.Contains(err.Error(), "Bakend") || !strings.Contains(err.Error(), m.ConfigKey()) {
		t.Fatalf("unknown field: %v", err)
	}
}

// snapshots collects what Run publishes.
type snapshots struct {
	mu      sync.Mutex
	entries map[string]subnet.Entry
	last    subnet.Snapshot
	n       int
	gate    chan struct{} // if set, the first publish waits on it
}

func (s *snapshots) publish(c subnet.Change) {
	s.mu.Lock()
	if s.entries == nil {
		s.entries = map[string]subnet.Entry{}
	}
	subnet.Fold(s.entries, c)
	s.last, s.n = subnet.SnapshotOf(subnet.Entries(s.entries)), s.n+1
	gate, first := s.gate, s.n == 1
	s.mu.Unlock()
	if gate != nil && first {
		<-gate
	}
}

func (s *snapshots) waitFor(t *testing.T, what string, ok func(subnet.Snapshot) bool) subnet.Snapshot {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		s.mu.Lock()
		snap, n := s.last, s.n
		s.mu.Unlock()
		if n > 0 && ok(snap) {
			return snap
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("no snapshot with %s within 10s", what)
	return subnet.Snapshot{}
}

func has(snap subnet.Snapshot, s string) bool {
	for _, l := range snap.Leases {
		if l.Subnet.String() == s {
			return true
		}
	}
	return false
}

func TestRunWatchesLeases(t *testing.T) {
	c := client(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	m := newManager(t, c, 9)
	cfg := config(t, c, m, `{"Network":"10.53.0.0/16","Backend":{"Type":"host-gw"}}`)
	own, err := m.AcquireLease(ctx, cfg, attrs("192.168.9.1"), subnet.Lease{})
	if err != nil {
		t.Fatal(err)
	}
	var s snapshots
	done := make(chan error, 1)
	go func() { done <- m.Run(ctx, s.publish) }()
	s.waitFor(t, "the own lease", func(sn subnet.Snapshot) bool { return has(sn, own.Subnet.String()) })

	put := func(k, v string) {
		if _, err := c.Put(ctx, m.SubnetsPrefix()+k, v); err != nil {
			t.Fatal(err)
		}
	}
	put("10.53.200.0-24", `{"PublicIP":"192.168.9.200","BackendType":"host-gw"}`)
	s.waitFor(t, "an added peer", func(sn subnet.Snapshot) bool { return has(sn, "10.53.200.0/24") })
	put("10.53.201.0-24", `{"PublicIP":"not-an-ip"`)
	snap := s.waitFor(t, "a refused entry", func(sn subnet.Snapshot) bool { return len(sn.Refused) == 1 })
	if r := snap.Refused[0]; !strings.HasSuffix(r.Key, "10.53.201.0-24") || !strings.Contains(r.Err.Error(), "decoding") || has(snap, "10.53.201.0/24") {
		t.Fatalf("refusal %+v: want the key named and no lease from it", r)
	}
	if _, err := c.Delete(ctx, m.SubnetsPrefix()+"10.53.200.0-24"); err != nil {
		t.Fatal(err)
	}
	s.waitFor(t, "a deleted peer gone", func(sn subnet.Snapshot) bool { return !has(sn, "10.53.200.0/24") })

	// Deleting this node's own key stops it, as in flannel.
	if _, err := c.Delete(ctx, m.SubnetsPrefix()+own.Key()); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if !errors.Is(err, ErrLeaseRevoked) {
			t.Fatalf("Run returned %v, want ErrLeaseRevoked", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not stop after its lease was deleted")
	}
}

func TestRunRelistsAfterCompaction(t *testing.T) {
	c := client(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	m := newManager(t, c, 10)
	s := snapshots{gate: make(chan struct{})}
	go func() { _ = m.Run(ctx, s.publish) }()
	s.waitFor(t, "the first listing", func(subnet.Snapshot) bool { return true })
	// While the watch has not started, history moves on and is compacted
	// away: the watch from the listed revision must fail and re-list.
	var rev int64
	for i := range 5 {
		r, err := c.Put(ctx, m.SubnetsPrefix()+fmt.Sprintf("10.54.%d.0-24", i+1), `{"PublicIP":"192.168.9.9","BackendType":"host-gw"}`)
		if err != nil {
			t.Fatal(err)
		}
		rev = r.Header.Revision
	}
	if _, err := c.Compact(ctx, rev); err != nil {
		t.Fatal(err)
	}
	close(s.gate)
	s.waitFor(t, "all five leases after re-listing", func(sn subnet.Snapshot) bool { return len(sn.Leases) == 5 })
}

func TestRenewBeforeExpiry(t *testing.T) {
	c := client(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	m := New(Options{Client: c, Logger: quiet, Prefix: testPrefix(t), TTL: 6 * time.Second, RenewMargin: 5 * time.Second})
	cfg := config(t, c, m, `{"Network":"10.55.0.0/16","Backend":{"Type":"host-gw"}}`)
	l, err := m.AcquireLease(ctx, cfg, attrs("192.168.9.1"), subnet.Lease{})
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = m.Run(ctx, func(subnet.Change) {}) }()
	// Without renewal the key would be gone after 6s; check at 9s.
	time.Sleep(9 * time.Second)
	resp, err := c.Get(ctx, m.SubnetsPrefix()+l.Key())
	if err != nil || len(resp.Kvs) != 1 {
		t.Fatalf("lease key gone after its TTL: renewal did not happen (%v)", err)
	}
}

// getKV reads one key, failing the test when it is not there.
func getKV(t *testing.T, c *clientv3.Client, key string) *mvccpb.KeyValue {
	t.Helper()
	resp, err := c.Get(context.Background(), key)
	if err != nil || len(resp.Kvs) != 1 {
		t.Fatalf("key %s: %v (%d keys)", key, err, len(resp.Kvs))
	}
	return resp.Kvs[0]
}

// Another client overwriting this node's lease (a node with the same
// prefix credentials, pointing the subnet at itself) is undone: the value
// and the etcd lease are this node's again, and the overwrite is counted.
// The node's own updates are not counted.
func TestOwnLeaseOverwriteUndone(t *testing.T) {
	c := client(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	m := newManager(t, c, 11)
	cfg := config(t, c, m, `{"Network":"10.54.0.0/16","Backend":{"Type":"host-gw"}}`)
	own, err := m.AcquireLease(ctx, cfg, attrs("192.168.11.1"), subnet.Lease{})
	if err != nil {
		t.Fatal(err)
	}
	var s snapshots
	done := make(chan error, 1)
	go func() { done <- m.Run(ctx, s.publish) }()
	s.waitFor(t, "the own lease", func(sn subnet.Snapshot) bool { return has(sn, own.Subnet.String()) })
	key := m.SubnetsPrefix() + own.Key()
	before := getKV(t, c, key)

	if err := m.UpdateBackendData(ctx, []byte(`{"VNI":1}`), nil); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Put(ctx, key, `{"PublicIP":"192.168.11.66","BackendType":"host-gw"}`); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		kv := getKV(t, c, key)
		if strings.Contains(string(kv.Value), `"192.168.11.1"`) && kv.Lease == before.Lease {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the overwritten lease was not written back: %s (etcd lease %x, want %x)", kv.Value, kv.Lease, before.Lease)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if n := m.OwnLeaseConflicts(); n != 1 {
		t.Errorf("OwnLeaseConflicts() = %d, want 1 (one overwrite; the node's own update is not one)", n)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// Two dual-stack nodes that pick different IPv4 subnets and the same IPv6
// one, each from a listing without the other's lease: the later yields
// its lease, and its next attempt takes another IPv6 subnet.
func TestAcquireDualStackLosesARaceForItsIPv6Subnet(t *testing.T) {
	c := client(t)
	ctx := context.Background()
	m1, m2 := newManager(t, c, 1), newManager(t, c, 2)
	cfg := config(t, c, m1, `{"Network":"10.52.0.0/16","EnableIPv6":true,"IPv6Network":"fd00:52::/48","Backend":{"Type":"host-gw"}}`)
	stale, err := m2.list(ctx)
	if err != nil {
		t.Fatal(err)
	}
	hint := func(v4 string) subnet.Lease {
		return subnet.Lease{Subnet: netip.MustParsePrefix(v4), IPv6Subnet: netip.MustParsePrefix("fd00:52:0:7::/64")}
	}
	l1, err := m1.AcquireLease(ctx, cfg, attrs("192.168.9.1"), hint("10.52.1.0/24"))
	if err != nil || l1.IPv6Subnet != hint("10.52.1.0/24").IPv6Subnet {
		t.Fatalf("first node: %v, %v", l1, err)
	}
	a2 := attrs("192.168.9.2")
	value, _ := json.Marshal(a2)
	l2, ok, err := m2.tryAcquire(ctx, cfg, a2, value, hint("10.52.2.0/24"), stale)
	if err != nil {
		t.Fatal(err)
	}
	if ok {
		t.Fatalf("the second node holds %s too, beside %s", l2, l1)
	}
	resp, err := c.Get(ctx, m2.SubnetsPrefix(), clientv3.WithPrefix(), clientv3.WithKeysOnly())
	if err != nil || len(resp.Kvs) != 1 {
		t.Fatalf("the registry after the race: %v, %v; want the first node's lease alone", resp.Kvs, err)
	}
	l2, err = m2.AcquireLease(ctx, cfg, a2, hint("10.52.2.0/24"))
	if err != nil || l2.IPv6Subnet == l1.IPv6Subnet {
		t.Fatalf("second node: %v, %v; the first holds %s", l2, err, l1)
	}
}

// A client with a node's credentials writes a lease of 1 MB and a key of
// 4 KB: both are refused unparsed, named within bounds (the value never
// quoted), and the long key's delete clears its refusal. A lease whose
// fields are long is refused with them truncated.
func TestRunRefusesOversizedRecords(t *testing.T) {
	c := client(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	m := newManager(t, c, 11)
	var s snapshots
	go func() { _ = m.Run(ctx, s.publish) }()
	s.waitFor(t, "the first listing", func(subnet.Snapshot) bool { return true })
	put := func(k, v string) {
		t.Helper()
		if _, err := c.Put(ctx, m.SubnetsPrefix()+k, v); err != nil {
			t.Fatal(err)
		}
	}
	big := `{"PublicIP":"192.168.9.7","BackendType":"host-gw","BackendData":{"pad":"` + strings.Repeat("x", 1<<20) + `"}}`
	put("10.53.7.0-24", big)
	longKey := "10.53.8.0-24" + strings.Repeat("/y", 2048)
	put(longKey, `{"PublicIP":"192.168.9.8","BackendType":"host-gw"}`)
	put("10.53.9.0-24", `{"PublicIP":"`+strings.Repeat("9", 5000)+`","BackendType":"host-gw"}`)
	put("10.53.10.0-24", `{"PublicIP":"192.168.9.10","BackendType":"`+strings.Repeat("b", 5000)+`"}`)
	snap := s.waitFor(t, "four refusals", func(sn subnet.Snapshot) bool { return len(sn.Refused) == 4 })
	for _, r := range snap.Refused {
		if len(r.Key) > MaxKeyBytes || len(r.Err.Error()) > 400 {
			t.Errorf("refusal of %d-byte name, %d-byte reason: %.200s: %.300s", len(r.Key), len(r.Err.Error()), r.Key, r.Err)
		}
		switch {
		case strings.HasSuffix(r.Key, "10.53.7.0-24"):
			if !strings.Contains(r.Err.Error(), fmt.Sprintf("a value of %d bytes, over the %d", len(big), MaxValueBytes)) {
				t.Errorf("the 1 MB lease refused for %q", r.Err)
			}
		case strings.Contains(r.Key, "10.53.8.0-24"):
			if !strings.Contains(r.Err.Error(), fmt.Sprintf("%d bytes, over the %d a lease key may have", len(m.SubnetsPrefix()+longKey), MaxKeyBytes)) {
				t.Errorf("the long key refused for %q", r.Err)
			}
		case strings.HasSuffix(r.Key, "10.53.9.0-24"), strings.HasSuffix(r.Key, "10.53.10.0-24"):
			if !strings.Contains(r.Err.Error(), `..."`) {
				t.Errorf("a long field quoted whole: %.300s", r.Err)
			}
		default:
			t.Errorf("refusal %s: %v", r.Key, r.Err)
		}
	}
	if len(snap.Leases) != 0 {
		t.Errorf("leases %v from oversized records", snap.Leases)
	}
	if _, err := c.Delete(ctx, m.SubnetsPrefix()+longKey); err != nil {
		t.Fatal(err)
	}
	s.waitFor(t, "the long key's refusal gone with it", func(sn subnet.Snapshot) bool { return len(sn.Refused) == 3 })
}
