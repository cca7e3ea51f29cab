package netfilter

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/twill-net/twill/network"
	"github.com/twill-net/twill/nl"
	"github.com/twill-net/twill/testsupport/netnstest"
)

// node is a node namespace with two pods and an outside host:
//
//	pod1 10.244.3.2 ─ 10.244.3.1 ┐
//	pod2 10.244.5.2 ─ 10.244.5.1 ┤ node ─ 192.0.2.1/24 ─ 192.0.2.2 outside
type node struct {
	node, pod1, pod2, outside string
	target                    ns.NetNS
}

func newNode(t *testing.T) *node {
	t.Helper()
	n := &node{node: netnstest.New(t, "nfn"), pod1: netnstest.New(t, "nfp"), pod2: netnstest.New(t, "nfq"), outside: netnstest.New(t, "nfo")}
	for _, l := range []struct{ other, nodeIf, nodeAddr, otherAddr, via string }{
		{n.pod1, "v1", "10.244.3.1/24", "10.244.3.2/24", "10.244.3.1"},
		{n.pod2, "v2", "10.244.5.1/24", "10.244.5.2/24", "10.244.5.1"},
		{n.outside, "eth0", "192.0.2.1/24", "192.0.2.2/24", ""},
	} {
		netnstest.Veth(t, n.node, l.nodeIf, l.other, "eth0")
		netnstest.IP(t, n.node, "addr", "add", l.nodeAddr, "dev", l.nodeIf)
		netnstest.IP(t, l.other, "addr", "add", l.otherAddr, "dev", "eth0")
		if l.via != "" {
			netnstest.IP(t, l.other, "route", "add", "default", "via", l.via)
		}
	}
	if out, err := netnstest.Exec(n.node, "sysctl", "-qw", "net.ipv4.ip_forward=1"); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	var err error
	if n.target, err = ns.GetNS("/var/run/netns/" + n.node); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.target.Close() })
	return n
}

func (n *node) do(t *testing.T, f func() error) {
	t.Helper()
	if err := n.target.Do(func(ns.NetNS) error { return f() }); err != nil {
		t.Fatal(err)
	}
}

// source connects from one namespace to another's address and returns the
// source address the listener saw.
func source(t *testing.T, from, to string, addr netip.Addr) netip.Addr {
	t.Helper()
	a, err := dialSeen(from, to, addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

func dialSeen(from, to string, addr netip.Addr, timeout time.Duration) (netip.Addr, error) {
	var l net.Listener
	if err := ns.WithNetNSPath("/var/run/netns/"+to, func(ns.NetNS) error {
		var err error
		l, err = net.Listen("tcp", netip.AddrPortFrom(addr, 9000).String())
		return err
	}); err != nil {
		return netip.Addr{}, err
	}
	defer l.Close()
	seen := make(chan netip.Addr, 1)
	go func() {
		if c, err := l.Accept(); err == nil {
			seen <- c.RemoteAddr().(*net.TCPAddr).AddrPort().Addr().Unmap()
			c.Close()
		}
	}()
	if err := ns.WithNetNSPath("/var/run/netns/"+from, func(ns.NetNS) error {
		c, err := net.DialTimeout("tcp", netip.AddrPortFrom(addr, 9000).String(), timeout)
		if err == nil {
			c.Close()
		}
		return err
	}); err != nil {
		return netip.Addr{}, fmt.Errorf("TCP %s → %s: %w", from, addr, err)
	}
	select {
	case a := <-seen:
		return a, nil
	case <-time.After(5 * time.Second):
		return netip.Addr{}, errors.New("no connection seen")
	}
}

// Both modes, the same assertions: the rules read back from the kernel,
// the packets they NAT or not, drift reported and repaired on change, the
// other mode's rules removed, and cleanup.
func TestPrivilegedModes(t *testing.T) {
	for _, tc := range []struct {
		mode               Mode
		read, deleteARule  []string
		wantRead, breakOut string
	}{
		{IPTables, []string{"iptables-save"}, []string{"iptables", "-t", "nat", "-D", "TWILL-POSTRTG", "2"},
			"-A TWILL-POSTRTG -s 10.244.0.0/16 ! -d 224.0.0.0/4 -m comment --comment \"twill: pod to outside\" -j MASQUERADE --random-fully", "pod to outside"},
		{NFTables, []string{"nft", "list", "ruleset"}, []string{"nft", "flush", "chain", "inet", "twill", "postrouting"},
			`ip saddr 10.244.0.0/16 ip daddr != 224.0.0.0/4 masquerade fully-random comment "twill: pod to outside (ipv4)"`, "pod to outside"},
	} {
		t.Run(string(tc.mode), func(t *testing.T) {
			n := newNode(t)
			log := slog.New(slog.NewTextHandler(io.Discard, nil))
			var repairs atomic.Int32
			o := Options{Logger: log, IPMasq: true, Repaired: func() { repairs.Add(1) },
				Networks: []network.NetworkPair{{Cluster: netip.MustParsePrefix("10.244.0.0/16"), Local: netip.MustParsePrefix("10.244.3.0/24")}}}
			rules := NewRules(tc.mode, o)
			k := NewKeeper(tc.mode, rules, o)
			read := func() string {
				out, err := netnstest.Exec(n.node, tc.read[0], tc.read[1:]...)
				if err != nil {
					t.Fatalf("%v: %s", err, out)
				}
				return out
			}
			// The premise: the outside host has no route to pods, so without
			// masquerading a pod cannot reach it.
			if got, err := dialSeen(n.pod1, n.outside, netip.MustParseAddr("192.0.2.2"), time.Second); err == nil {
				t.Fatalf("without twill's rules the outside host answered the pod (seen from %s)", got)
			}

			n.do(t, func() error { return RemoveOthers(tc.mode, log) })
			n.do(t, rules.Sync)
			if got := read(); !strings.Contains(got, tc.wantRead) {
				t.Fatalf("rules read back lack %q:\n%s", tc.wantRead, got)
			}
			if got := source(t, n.pod1, n.outside, netip.MustParseAddr("192.0.2.2")); got != netip.MustParseAddr("192.0.2.1") {
				t.Errorf("pod → outside arrived from %s, want the node's 192.0.2.1", got)
			}
			if got := source(t, n.pod1, n.pod2, netip.MustParseAddr("10.244.5.2")); got != netip.MustParseAddr("10.244.3.2") {
				t.Errorf("pod → pod arrived from %s, want the pod's own 10.244.3.2", got)
			}

			// Drift is reported, then repaired on the change alone (the
			// poll is an hour away).
			if out, err := netnstest.Exec(n.node, tc.deleteARule[0], tc.deleteARule[1:]...); err != nil {
				t.Fatalf("%v: %s", err, out)
			}
			var d network.RuleDrift
			n.do(t, func() (err error) { d, err = rules.Drift(); return err })
			if !strings.Contains(strings.Join(d.Missing, "\n"), tc.breakOut) {
				t.Errorf("drift %+v lacks the missing %q rule", d, tc.breakOut)
			}
			k.Resync, k.WatchedResync = time.Hour, time.Hour
			k.Watch = netnstest.WatchIn(n.target, nl.WatchNftables)
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { done <- n.target.Do(func(ns.NetNS) error { return k.Run(ctx) }) }()
			deadline := time.Now().Add(5 * time.Second)
			for !strings.Contains(read(), tc.wantRead) {
				if time.Now().After(deadline) {
					t.Errorf("the deleted rule was not restored within 5 s:\n%s", read())
					break
				}
				time.Sleep(20 * time.Millisecond)
			}
			cancel()
			if err := <-done; err != nil {
				t.Fatal(err)
			}
			if repairs.Load() == 0 {
				t.Error("the repair was not reported (twill_drift_repairs_total would not count it)")
			}

			// The other mode takes over: this mode's rules go.
			other := map[Mode]Mode{IPTables: NFTables, NFTables: IPTables}[tc.mode]
			n.do(t, func() error { return RemoveOthers(other, log) })
			if got := read(); strings.Contains(got, "twill") || strings.Contains(got, "TWILL") {
				t.Errorf("switching to %s left the %s rules:\n%s", other, tc.mode, got)
			}
			n.do(t, rules.Sync)
			n.do(t, Cleanup)
			if got := read(); strings.Contains(got, "twill") || strings.Contains(got, "TWILL") {
				t.Errorf("after cleanup:\n%s", got)
			}
		})
	}
}
