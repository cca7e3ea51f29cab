package eni

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/twill-net/twill/backend"
	enicni "github.com/twill-net/twill/backend/eni/cni"
	"github.com/twill-net/twill/nl"
	"github.com/twill-net/twill/subnet"
)

// The factory refuses IPv6 and an unusable provider, naming the field,
// and builds its provider only on the node (not for twillctl's check).
func TestNewChecksItsConfig(t *testing.T) {
	conf := func(extra string) *subnet.Config {
		cfg, err := subnet.ParseConfig([]byte(`{"Network":"10.10.128.0/17","SubnetLen":24,` + extra +
			`"Backend":{"Type":"eni","Interface":"eth1","ProviderConfig":{"ENIs":[{"ID":"eni-1","MAC":"0a:00:00:00:00:01","PrimaryIP":"10.10.1.5/24","Gateway":"10.10.1.1"}]}}}`))
		if err != nil {
			t.Fatal(err)
		}
		return cfg
	}
	opts := backend.Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Config: conf("")}
	b, err := New(opts)
	if err != nil || b.(*Backend).prov == nil {
		t.Fatalf("New: %v, %v; want a backend with the static provider", b, err)
	}
	opts.CheckOnly = true
	if b, err := New(opts); err != nil || b.(*Backend).prov != nil {
		t.Errorf("New for a check: %v, %v; want no provider built", b, err)
	}
	opts.CheckOnly, opts.Config = false, conf(`"EnableIPv6":true,"IPv6Network":"fd00::/56",`)
	if _, err := New(opts); err == nil || !strings.Contains(err.Error(), "EnableIPv6") {
		t.Errorf("New with IPv6: %v, want the field named", err)
	}
}

// What the daemon reads of an attached network: its MTU (the ENI's, as
// nothing is encapsulated), the plugin's environment, a warm pool that
// runs until its context ends, and a watch that sees twill's routes
// deleted behind its back.
func TestNetworkSurface(t *testing.T) {
	prefix := newENINode(t, ModePrefix)
	if got := prefix.nw.MTU(); got != 9001 {
		t.Errorf("MTU %d, want the ENI's 9001", got)
	}
	env := prefix.nw.Env()
	if env[enicni.EnvMode] != ModePrefix || env[enicni.EnvENIInterface] != "eth1" || env[enicni.EnvPoolDir] != "" {
		t.Errorf("prefix mode's env %v", env)
	}
	if err := prefix.nw.Run(context.Background()); err != nil {
		t.Errorf("prefix mode's Run: %v, want it to return at once", err)
	}

	pooled := newENINode(t, ModeSecondaryIP)
	if env := pooled.nw.Env(); env[enicni.EnvPoolDir] == "" {
		t.Errorf("secondary-ip mode's env %v lacks the pool's directory", env)
	}
	pooled.nw.pool.Log, pooled.nw.pool.Every = slog.New(slog.NewTextHandler(io.Discard, nil)), 5*time.Millisecond
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- pooled.nw.Run(ctx) }()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		if f, err := enicni.ReadPoolFile(pooled.nw.pool.Dir); err == nil && len(f.IPs) > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the warm pool did not grow within 10 s of Run")
		}
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Run: %v", err)
	}

	if err := prefix.nw.Reconcile(context.Background(), nil); err != nil {
		t.Fatal(err)
	}
	poked := make(chan struct{}, 1)
	watching := make(chan struct{})
	wctx, wcancel := context.WithCancel(context.Background())
	defer wcancel()
	go func() {
		_ = prefix.nw.WatchKernel(wctx, func() {
			select {
			case poked <- struct{}{}:
			default:
			}
		}, func() { close(watching) })
	}()
	<-watching
	routes, err := prefix.k.Routes(nl.FamilyAll, nl.RouteFilter{Table: prefix.nw.set.Table, Protocol: nl.RouteProtocol})
	if err != nil || len(routes) == 0 {
		t.Fatalf("twill's routes in the ENI table: %v, %v", routes, err)
	}
	if err := prefix.k.RouteDel(routes[0]); err != nil {
		t.Fatal(err)
	}
	select {
	case <-poked:
	case <-time.After(10 * time.Second):
		t.Fatal("a route of twill's deleted behind its back: no poke within 10 s")
	}
}

// The static provider: declared addresses stay, undeclared prefixes are
// refused, naming the ENI's declared ones.
func TestStaticProviderRefusesWhatIsNotDeclared(t *testing.T) {
	p, err := newProvider("static", []byte(`{"ENIs":[{"ID":"eni-1","MAC":"0a:00:00:00:00:01","PrimaryIP":"10.10.1.5/24","Gateway":"10.10.1.1","Prefixes":["10.10.128.0/24"]}]}`))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := p.UnassignIPs(ctx, "eni-1", []netip.Addr{netip.MustParseAddr("10.10.1.20")}); !errors.Is(err, ErrNotSupported) {
		t.Errorf("UnassignIPs: %v, want %v", err, ErrNotSupported)
	}
	if err := p.AssignPrefix(ctx, "eni-1", netip.MustParsePrefix("10.10.128.0/24")); err != nil {
		t.Errorf("AssignPrefix of a declared prefix: %v", err)
	}
	if err := p.AssignPrefix(ctx, "eni-1", netip.MustParsePrefix("10.10.129.0/24")); !errors.Is(err, ErrNotSupported) || !strings.Contains(err.Error(), "10.10.128.0/24") {
		t.Errorf("AssignPrefix of another prefix: %v, want it refused naming the declared ones", err)
	}
	if err := p.AssignPrefix(ctx, "eni-9", netip.MustParsePrefix("10.10.128.0/24")); err == nil {
		t.Error("AssignPrefix on an unknown ENI: no error")
	}
	if err := p.UnassignPrefix(ctx, "eni-1", netip.MustParsePrefix("10.10.128.0/24")); err != nil {
		t.Errorf("UnassignPrefix: %v", err)
	}
}
