package eni

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twill-net/twill/backend"
	"github.com/twill-net/twill/backend/backendtest"
	enicni "github.com/twill-net/twill/backend/eni/cni"
	"github.com/twill-net/twill/nl"
	"github.com/twill-net/twill/nl/nlfake"
	"github.com/twill-net/twill/subnet"
)

// The eni backend against nl/nlfake and an in-memory cloud,
// without root.

var _ Kernel = (*nlfake.Kernel)(nil)

// cloud is an in-memory provider: one ENI, a limit of secondary IPs, and
// the prefixes delegated to it. It models the cloud's state.
type cloud struct {
	mu       sync.Mutex
	eni      ENI
	limit    int
	next     byte
	prefixes []netip.Prefix
	fail     error
}

func (c *cloud) DescribeENI(_ context.Context, mac string) (ENI, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if mac != c.eni.MAC {
		return ENI{}, fmt.Errorf("no ENI with MAC %s", mac)
	}
	e := c.eni
	e.Prefixes = slices.Clone(c.prefixes)
	return e, nil
}

func (c *cloud) AssignIPs(_ context.Context, _ string, n int) (ENI, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.fail != nil {
		return c.eni, c.fail
	}
	for range n {
		if len(c.eni.SecondaryIPs) >= c.limit {
			return c.eni, fmt.Errorf("ENI %s holds %d secondary IPs: %w", c.eni.ID, c.limit, ErrLimitExceeded)
		}
		c.next++
		c.eni.SecondaryIPs = append(slices.Clone(c.eni.SecondaryIPs), netip.AddrFrom4([4]byte{10, 10, 1, 100 + c.next}))
	}
	return c.eni, nil
}

func (c *cloud) UnassignIPs(_ context.Context, _ string, ips []netip.Addr) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.eni.SecondaryIPs = slices.DeleteFunc(slices.Clone(c.eni.SecondaryIPs), func(a netip.Addr) bool { return slices.Contains(ips, a) })
	return nil
}

func (c *cloud) AssignPrefix(_ context.Context, _ string, p netip.Prefix) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !slices.Contains(c.prefixes, p) {
		c.prefixes = append(c.prefixes, p)
	}
	return nil
}

func (c *cloud) UnassignPrefix(_ context.Context, _ string, p netip.Prefix) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.prefixes = slices.DeleteFunc(c.prefixes, func(q netip.Prefix) bool { return q == p })
	return nil
}

type eniNode struct {
	k       *nlfake.Kernel
	eth1    nl.Link
	cloud   *cloud
	sysctls map[string]string
	b       *Backend
	nw      *Network
	log     strings.Builder
}

func newENINode(t *testing.T, mode string) *eniNode {
	t.Helper()
	k := &nlfake.Kernel{}
	eth0 := k.AddLink("eth0", 1500, true, netip.MustParsePrefix("10.10.0.5/24"))
	eth1 := k.AddLink("eth1", 9001, false)
	c := &cloud{eni: ENI{ID: "eni-1", MAC: fmt.Sprintf("%x:%x:%x:%x:%x:%x", eth1.HardwareAddr[0], eth1.HardwareAddr[1], eth1.HardwareAddr[2],
		eth1.HardwareAddr[3], eth1.HardwareAddr[4], eth1.HardwareAddr[5]),
		PrimaryIP: netip.MustParsePrefix("10.10.1.5/24"), Gateway: netip.MustParseAddr("10.10.1.1")}, limit: 4,
		prefixes: []netip.Prefix{netip.MustParsePrefix("10.10.99.0/24")}} // from an earlier lease
	c.eni.MAC = strings.ToLower(netHW(eth1.HardwareAddr))
	n := &eniNode{k: k, eth1: eth1, cloud: c, sysctls: map[string]string{}}
	cfg, err := subnet.ParseConfig([]byte(`{"Network":"10.10.128.0/17","SubnetLen":24,"Backend":{"Type":"eni","Interface":"eth1","Mode":"` + mode + `"}}`))
	if err != nil {
		t.Fatal(err)
	}
	set, err := ParseConfig(cfg.Backend)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	b := &Backend{opts: backend.Options{Logger: slog.New(slog.NewTextHandler(&n.log, nil)), Netlink: k, Config: cfg, StateDir: t.TempDir(),
		ExtIface: backend.ExternalInterface{Link: eth0, Addr: netip.MustParseAddr("10.10.0.5"), PublicIP: netip.MustParseAddr("10.10.0.5")}},
		set: set, prov: c, k: k, log: slog.New(slog.NewTextHandler(&n.log, nil)),
		sysctl: func(name, value string) error { mu.Lock(); n.sysctls[name] = value; mu.Unlock(); return nil }}
	attrs, err := b.Prepare(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var d Data
	if err := json.Unmarshal(attrs.BackendData, &d); err != nil || d.ENIIP != netip.MustParseAddr("10.10.1.5") || d.ENI != "eni-1" {
		t.Fatalf("published %s (%v), want the ENI and its primary IP", attrs.BackendData, err)
	}
	// The kernel's own connected route, once the address is on the link.
	k.RouteBatch([]nl.RouteOp{{Op: nl.OpAdd, Route: nl.Route{Dst: netip.MustParsePrefix("10.10.1.0/24"), LinkIndex: eth1.Index, Scope: nl.ScopeLink, Protocol: 2}}})
	nw, err := b.Attach(context.Background(), subnet.Lease{Subnet: netip.MustParsePrefix("10.10.130.0/24"), Attrs: attrs})
	if err != nil {
		t.Fatal(err)
	}
	n.b, n.nw = b, nw.Network.(*Network)
	return n
}

func netHW(b []byte) string {
	parts := make([]string, len(b))
	for i, x := range b {
		parts[i] = fmt.Sprintf("%02x", x)
	}
	return strings.Join(parts, ":")
}

func (n *eniNode) table(t *testing.T, table int) []string {
	t.Helper()
	return backendtest.Routes(t, n.k, table)
}

func (n *eniNode) rules(t *testing.T) []string {
	t.Helper()
	rs, _ := n.k.Rules(nl.FamilyAll)
	var out []string
	for _, r := range rs {
		out = append(out, r.String())
	}
	return out
}

func eniPeer(sub, eniIP string) subnet.Lease {
	return subnet.Lease{Subnet: netip.MustParsePrefix(sub), Attrs: subnet.LeaseAttrs{PublicIP: netip.MustParseAddr("10.10.0.9"), BackendType: Type,
		BackendData: json.RawMessage(`{"ENI":"eni-x","ENIIP":"` + eniIP + `"}`)}}
}

func TestFakePrefixMode(t *testing.T) {
	n := newENINode(t, ModePrefix)
	ctx := context.Background()
	if l, _ := n.k.LinkByName("eth1"); !l.Up {
		t.Error("Prepare left the ENI down")
	}
	if a, _ := n.k.Addrs(n.eth1.Index, nl.FamilyV4); len(a) != 1 || a[0].Prefix.String() != "10.10.1.5/24" {
		t.Errorf("ENI addresses %v, want its primary IP", a)
	}
	if n.cloud.prefixes[0].String() != "10.10.99.0/24" {
		t.Fatal("Prepare or Attach changed the cloud")
	}
	peers := []subnet.Lease{eniPeer("10.10.131.0/24", "10.10.1.6"), eniPeer("10.10.132.0/24", "10.99.0.1")}
	for range 2 {
		if err := n.nw.Reconcile(ctx, peers); err != nil {
			t.Fatal(err)
		}
	}
	if got := fmt.Sprint(n.cloud.prefixes); got != "[10.10.130.0/24]" {
		t.Errorf("cloud prefixes %s: want the lease delegated and the earlier lease's taken back", got)
	}
	want := []string{"0.0.0.0/0 via 10.10.1.1 dev#2 table 100", "10.10.1.0/24 dev#2 table 100", "10.10.131.0/24 via 10.10.1.6 dev#2 table 100"}
	if got := n.table(t, 100); !slices.Equal(got, want) {
		t.Errorf("table 100 %q, want %q", got, want)
	}
	if got := n.table(t, 0); len(got) != 0 {
		t.Errorf("main table %q: the VPC subnet's route should be gone from it", got)
	}
	if got := n.rules(t); !slices.Equal(got, []string{"pref 1536 from 10.10.1.5/32 lookup 100"}) {
		t.Errorf("rules %q", got)
	}
	if n.sysctls["net/ipv4/conf/eth1/rp_filter"] != "2" {
		t.Errorf("sysctls %v: want loose rp_filter on the ENI", n.sysctls)
	}
	if c := strings.Count(n.log.String(), "refusing peers whose ENI data cannot be routed"); c != 1 {
		t.Errorf("the peer outside the VPC subnet was logged %d times, want once:\n%s", c, n.log.String())
	}

	// Someone deletes the node rule: drift names it, a reconcile after a
	// resync puts it back.
	if err := n.k.RuleDel(nl.Rule{Priority: 1536, Src: netip.MustParsePrefix("10.10.1.5/32"), Table: 100}); err != nil {
		t.Fatal(err)
	}
	d, err := n.nw.Drift(ctx, peers)
	if err != nil || !strings.Contains(fmt.Sprint(d.Missing), "pref 1536 from 10.10.1.5/32 lookup 100") || len(d.Refused) != 1 {
		t.Fatalf("drift %+v, %v: want the missing rule and the refused peer", d, err)
	}
	n.nw.rules.Invalidate()
	if err := n.nw.Reconcile(ctx, peers[:1]); err != nil {
		t.Fatal(err)
	}
	if got := n.rules(t); len(got) != 1 {
		t.Errorf("rules after the repair %q", got)
	}
	if d, _ := n.nw.Drift(ctx, peers[:1]); len(d.Missing)+len(d.Extra)+len(d.Wrong)+len(d.Refused) != 0 {
		t.Errorf("drift after the repair: %+v", d)
	}
	env := n.nw.Env()
	if env[enicni.EnvTable] != "100" || env[enicni.EnvENIInterface] != "eth1" || env[enicni.EnvMode] != ModePrefix {
		t.Errorf("env %v", env)
	}
}

func TestFakeSecondaryIPPool(t *testing.T) {
	n := newENINode(t, ModeSecondaryIP)
	ctx := context.Background()
	if err := n.nw.Reconcile(ctx, nil); err != nil {
		t.Fatal(err)
	}
	if n.cloud.prefixes[0].String() != "10.10.99.0/24" {
		t.Error("secondary-ip mode delegated a prefix")
	}
	p := n.nw.pool
	p.Log = slog.New(slog.NewTextHandler(io.Discard, nil))
	pool := func() enicni.PoolFile {
		t.Helper()
		f, err := enicni.ReadPoolFile(p.Dir)
		if err != nil {
			t.Fatal(err)
		}
		return f
	}
	// Empty pool: it grows to the high water mark, within the ENI's limit.
	if err := p.Step(ctx); err != nil {
		t.Fatal(err)
	}
	f := pool()
	if len(f.IPs) != 4 || f.Exhausted == "" || !strings.Contains(f.Exhausted, "limit exceeded") {
		t.Fatalf("pool %+v: want the ENI's 4 IPs and why it cannot grow", f)
	}
	// Pods take three; the pool stays exhausted, and says so to the plugin.
	for _, ip := range f.IPs[:3] {
		if err := os.WriteFile(filepath.Join(p.Dir, enicni.PoolStoreName, ip.String()), []byte("pod"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := p.Step(ctx); err != nil {
		t.Fatal(err)
	}
	// The ENI may hold more now; pods leave; the surplus is released
	// after the cooldown, never an IP in use.
	n.cloud.mu.Lock()
	n.cloud.limit = 20
	n.cloud.mu.Unlock()
	p.lastTry = time.Time{}
	if err := p.Step(ctx); err != nil {
		t.Fatal(err)
	}
	f = pool()
	if len(f.IPs) != 8 || f.Exhausted != "" {
		t.Fatalf("pool %+v: want 3 in use and 5 free (the high water mark), and no longer exhausted", f)
	}
	// Two pods leave: 7 free, 2 above the high water mark. They go after
	// the cooldown (the first step only notes the surplus), never an IP in
	// use.
	for _, ip := range f.IPs[1:3] {
		if err := os.Remove(filepath.Join(p.Dir, enicni.PoolStoreName, ip.String())); err != nil {
			t.Fatal(err)
		}
	}
	p.Cooldown = 0
	for range 2 {
		if err := p.Step(ctx); err != nil {
			t.Fatal(err)
		}
	}
	f = pool()
	used, _ := enicni.PoolInUse(p.Dir)
	for ip := range used {
		if !slices.Contains(f.IPs, ip) {
			t.Errorf("released %s, which a pod holds", ip)
		}
	}
	if len(f.IPs) != 6 || len(used) != 1 {
		t.Errorf("pool %v with %d in use: want 6 IPs, 1 in use and 5 free", f.IPs, len(used))
	}
	n.cloud.mu.Lock()
	defer n.cloud.mu.Unlock()
	if len(n.cloud.eni.SecondaryIPs) != len(f.IPs) {
		t.Errorf("cloud holds %d IPs, pool.json lists %d", len(n.cloud.eni.SecondaryIPs), len(f.IPs))
	}
}
