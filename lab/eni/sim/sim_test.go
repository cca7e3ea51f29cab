package sim

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/twill-net/twill/backend/eni"
	"github.com/twill-net/twill/nl"
	"github.com/twill-net/twill/nl/nlfake"
)

// The simulated cloud over a modelled fabric namespace, without root: what
// it assigns is in its state file and routed in the fabric.

var _ Fabric = (*nlfake.Kernel)(nil)

func newCloud(t *testing.T, maxIPs int) (*Provider, *nlfake.Kernel, string) {
	t.Helper()
	fabric := &nlfake.Kernel{}
	fabric.AddLink("p1", 1500, true)
	fabric.AddLink("p2", 1500, true)
	path := filepath.Join(t.TempDir(), "vpc.json")
	err := Create(path, State{Fabric: "fab", VPC: netip.MustParsePrefix("10.10.0.0/16"), Subnet: netip.MustParsePrefix("10.10.1.0/28"),
		Gateway: netip.MustParseAddr("10.10.1.1"), MaxIPsPerENI: maxIPs, ENIs: []ENI{
			{ID: "eni-1", MAC: "0a:00:00:00:00:01", PrimaryIP: netip.MustParsePrefix("10.10.1.2/28"), Port: "p1"},
			{ID: "eni-2", MAC: "0a:00:00:00:00:02", PrimaryIP: netip.MustParsePrefix("10.10.1.3/28"), Port: "p2"},
		}})
	if err != nil {
		t.Fatal(err)
	}
	p, err := New([]byte(fmt.Sprintf(`{"StateFile":%q}`, path)))
	if err != nil {
		t.Fatal(err)
	}
	sp := p.(*Provider)
	sp.open = func(ns string) (Fabric, func(), error) {
		if ns != "fab" {
			return nil, nil, fmt.Errorf("namespace %q", ns)
		}
		return fabric, func() {}, nil
	}
	return sp, fabric, path
}

func fabricRoutes(t *testing.T, k *nlfake.Kernel) []string {
	t.Helper()
	rs, _ := k.Routes(nl.FamilyAll, nl.RouteFilter{Protocol: RouteProtocol})
	var out []string
	for _, r := range rs {
		out = append(out, r.String())
	}
	slices.Sort(out)
	return out
}

func TestNewNamesBadConfig(t *testing.T) {
	for raw, want := range map[string]string{
		`{}`:                           `StateFile ""`,
		`{"StateFile":"/nonexistent"}`: `StateFile "/nonexistent"`,
		`{"StateFile":7}`:              "StateFile",
	} {
		if _, err := New([]byte(raw)); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want it to name %s", raw, err, want)
		}
	}
}

func TestSecondaryIPs(t *testing.T) {
	p, fabric, path := newCloud(t, 3)
	ctx := context.Background()
	e, err := p.DescribeENI(ctx, "0A:00:00:00:00:01")
	if err != nil || e.ID != "eni-1" || e.Gateway.String() != "10.10.1.1" || e.MaxIPs != 3 {
		t.Fatalf("DescribeENI: %+v, %v", e, err)
	}
	if _, err := p.DescribeENI(ctx, "0a:00:00:00:00:99"); err == nil {
		t.Error("found an ENI for a MAC nobody has")
	}
	e, err = p.AssignIPs(ctx, "eni-1", 2)
	if err != nil || fmt.Sprint(e.SecondaryIPs) != "[10.10.1.4 10.10.1.5]" {
		t.Fatalf("AssignIPs: %v, %v: want the first free addresses, skipping the gateway and primary IPs", e.SecondaryIPs, err)
	}
	// Asking beyond the limit assigns what fits; then it says so.
	e, err = p.AssignIPs(ctx, "eni-1", 5)
	if err != nil || len(e.SecondaryIPs) != 3 {
		t.Fatalf("AssignIPs up to the limit: %v, %v", e.SecondaryIPs, err)
	}
	if e, err = p.AssignIPs(ctx, "eni-1", 1); !errors.Is(err, eni.ErrLimitExceeded) || len(e.SecondaryIPs) != 3 {
		t.Fatalf("AssignIPs at the limit: %v, %v: want ErrLimitExceeded and the ENI as it is", e.SecondaryIPs, err)
	}
	want := []string{"10.10.1.4/32 via 10.10.1.2 dev#1", "10.10.1.5/32 via 10.10.1.2 dev#1", "10.10.1.6/32 via 10.10.1.2 dev#1"}
	if got := fabricRoutes(t, fabric); !slices.Equal(got, want) {
		t.Fatalf("fabric routes %q, want %q", got, want)
	}
	// The subnet (/28: .1-.14) runs out for the second ENI.
	e2, err := p.AssignIPs(ctx, "eni-2", 3)
	if err != nil || len(e2.SecondaryIPs) != 3 {
		t.Fatalf("eni-2: %v, %v", e2.SecondaryIPs, err)
	}
	if err := p.UnassignIPs(ctx, "eni-1", []netip.Addr{netip.MustParseAddr("10.10.1.5"), netip.MustParseAddr("10.10.1.99")}); err != nil {
		t.Fatal(err)
	}
	if got := fabricRoutes(t, fabric); slices.Contains(got, "10.10.1.5/32 via 10.10.1.2 dev#1") {
		t.Errorf("fabric still routes an unassigned IP: %q", got)
	}
	st, err := Load(path)
	if err != nil || fmt.Sprint(st.ENIs[0].SecondaryIPs) != "[10.10.1.4 10.10.1.6]" {
		t.Fatalf("state after unassigning: %v, %v", st.ENIs[0].SecondaryIPs, err)
	}
	if _, err := p.AssignIPs(ctx, "eni-9", 1); err == nil {
		t.Error("assigned IPs to an ENI that does not exist")
	}
}

func TestSubnetFull(t *testing.T) {
	p, _, _ := newCloud(t, 0)
	ctx := context.Background()
	if e, err := p.AssignIPs(ctx, "eni-1", 100); err != nil || len(e.SecondaryIPs) != 11 {
		t.Fatalf("%v, %v: want the 11 free addresses of the /28 (.4 to .14)", e.SecondaryIPs, err)
	}
	if _, err := p.AssignIPs(ctx, "eni-2", 1); !errors.Is(err, eni.ErrSubnetFull) {
		t.Fatalf("%v, want ErrSubnetFull", err)
	}
}

func TestPrefixes(t *testing.T) {
	p, fabric, _ := newCloud(t, 3)
	ctx := context.Background()
	a, b := netip.MustParsePrefix("10.10.128.0/24"), netip.MustParsePrefix("10.10.129.0/24")
	for range 2 { // idempotent
		if err := p.AssignPrefix(ctx, "eni-1", a); err != nil {
			t.Fatal(err)
		}
	}
	if err := p.AssignPrefix(ctx, "eni-2", a); err == nil {
		t.Error("delegated one prefix to two ENIs")
	}
	for _, bad := range []string{"10.99.0.0/24", "10.10.1.0/24", "10.0.0.0/8"} {
		if err := p.AssignPrefix(ctx, "eni-2", netip.MustParsePrefix(bad)); err == nil {
			t.Errorf("delegated %s, which is not free VPC space", bad)
		}
	}
	if err := p.AssignPrefix(ctx, "eni-2", b); err != nil {
		t.Fatal(err)
	}
	want := []string{"10.10.128.0/24 via 10.10.1.2 dev#1", "10.10.129.0/24 via 10.10.1.3 dev#2"}
	if got := fabricRoutes(t, fabric); !slices.Equal(got, want) {
		t.Fatalf("fabric %q, want %q", got, want)
	}
	if err := p.UnassignPrefix(ctx, "eni-1", a); err != nil {
		t.Fatal(err)
	}
	if err := p.UnassignPrefix(ctx, "eni-1", a); err != nil {
		t.Fatal("unassigning twice:", err)
	}
	if got := fabricRoutes(t, fabric); !slices.Equal(got, want[1:]) {
		t.Fatalf("fabric %q, want %q", got, want[1:])
	}
	if e, _ := p.DescribeENI(ctx, "0a:00:00:00:00:01"); len(e.Prefixes) != 0 {
		t.Errorf("eni-1 still has %v", e.Prefixes)
	}
}

// TestConcurrentNodes: every node's twilld shares the state file; the
// lock keeps their changes from overwriting each other.
func TestConcurrentNodes(t *testing.T) {
	p, _, path := newCloud(t, 0)
	var wg sync.WaitGroup
	for _, id := range []string{"eni-1", "eni-2"} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 4 {
				if _, err := p.AssignIPs(context.Background(), id, 1); err != nil {
					t.Error(err)
				}
			}
		}()
	}
	wg.Wait()
	st, _ := Load(path)
	if n := len(st.ENIs[0].SecondaryIPs) + len(st.ENIs[1].SecondaryIPs); n != 8 {
		t.Fatalf("%d IPs recorded after 8 assignments", n)
	}
	seen := map[netip.Addr]bool{}
	for _, e := range st.ENIs {
		for _, ip := range e.SecondaryIPs {
			if seen[ip] {
				t.Fatalf("%s assigned twice", ip)
			}
			seen[ip] = true
		}
	}
}
