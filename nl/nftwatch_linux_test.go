package nl

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/twill-net/twill/testsupport/netnstest"
)

// TestWatchNftablesTable: another process's changes to the watched table
// are reported, and changes to other tables are not.
func TestWatchNftablesTable(t *testing.T) {
	name := netnstest.New(t, "nftw")
	target, err := ns.GetNS("/var/run/netns/" + name)
	if err != nil {
		t.Fatal(err)
	}
	defer target.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var changes atomic.Int32
	subscribed := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- netnstest.WatchIn(target, func(ctx context.Context, sub, changed func()) error {
			return WatchNftablesTable(ctx, "watched", sub, changed)
		})(ctx, func() { close(subscribed) }, func() { changes.Add(1) })
	}()
	<-subscribed
	nft := func(args ...string) {
		t.Helper()
		if out, err := netnstest.Exec(name, "nft", args...); err != nil {
			t.Fatalf("nft %v: %v: %s", args, err, out)
		}
	}
	nft("add", "table", "inet", "other")
	nft("add", "chain", "inet", "other", "c")
	time.Sleep(200 * time.Millisecond)
	if n := changes.Load(); n != 0 {
		t.Fatalf("%d changes reported for another table", n)
	}
	for _, cmd := range [][]string{
		{"add", "table", "inet", "watched"},
		{"add", "chain", "inet", "watched", "c", "{ type filter hook forward priority 0; }"},
		{"add", "rule", "inet", "watched", "c", "counter", "accept"},
		{"flush", "chain", "inet", "watched", "c"},
		{"delete", "table", "inet", "watched"},
	} {
		before := changes.Load()
		nft(cmd...)
		deadline := time.Now().Add(10 * time.Second)
		for changes.Load() == before && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond)
		}
		if changes.Load() != before+1 {
			t.Fatalf("nft %v: %d changes reported, want 1", cmd, changes.Load()-before)
		}
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// TestNftGeneration: reading the generation changes nothing, and every
// committed change, by nft or iptables-nft alike, moves it.
func TestNftGeneration(t *testing.T) {
	name := netnstest.New(t, "nftgen")
	target, err := ns.GetNS("/var/run/netns/" + name)
	if err != nil {
		t.Fatal(err)
	}
	defer target.Close()
	read := func() uint32 {
		t.Helper()
		var g uint32
		if err := target.Do(func(ns.NetNS) error {
			var err error
			g, err = NftGeneration()
			return err
		}); err != nil {
			t.Fatal(err)
		}
		return g
	}
	g0 := read()
	if g := read(); g != g0 {
		t.Fatalf("reading the generation moved it: %d, then %d", g0, g)
	}
	for _, cmd := range [][]string{
		{"nft", "add", "table", "ip", "gen"},
		{"iptables", "-t", "filter", "-A", "FORWARD", "-s", "10.9.0.0/16", "-j", "ACCEPT"},
	} {
		before := read()
		if out, err := netnstest.Exec(name, cmd[0], cmd[1:]...); err != nil {
			t.Fatalf("%v: %v: %s", cmd, err, out)
		}
		if g := read(); g == before {
			t.Fatalf("%v left the generation at %d", cmd, g)
		}
	}
}
