package e2e

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/twill-net/twill/internal/netnstest"
	"github.com/twill-net/twill/internal/nl"
	"github.com/twill-net/twill/internal/owned"
	"github.com/twill-net/twill/subnet"
)

const (
	benchPeers   = 5000
	benchSamples = 20
)

var benchNetwork = netip.MustParsePrefix("100.64.0.0/10")

// benchLease is the i-th synthetic peer: a /24 of 100.64.0.0/10 routed via
// an address on the node's 192.168.0.0/16 underlay.
func benchLease(i int) (key, value string, dst netip.Prefix) {
	dst = netip.PrefixFrom(subnet.NthSubnet(benchNetwork.Addr(), uint64(i+1), 24), 24)
	ip := netip.AddrFrom4([4]byte{192, 168, byte(1 + i/250), byte(1 + i%250)})
	return "/twill.io/network/subnets/" + subnet.SubnetKey(dst, netip.Prefix{}),
		fmt.Sprintf(`{"PublicIP":%q,"BackendType":"host-gw"}`, ip), dst
}

// routeEvents streams twill route events of a namespace.
func routeEvents(tb testing.TB, ns string) <-chan nl.RouteEvent {
	h, err := nl.Open(ns)
	if err != nil {
		tb.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ch := make(chan nl.RouteEvent, 4*benchPeers)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = h.WatchRoutes(ctx, nil, func(ev nl.RouteEvent) {
			if ev.Route.Protocol == owned.RouteProtocol {
				ch <- ev
			}
		})
	}()
	tb.Cleanup(func() { cancel(); <-done; h.Close() })
	return ch
}

func waitRoute(tb testing.TB, events <-chan nl.RouteEvent, dst netip.Prefix, deleted bool) {
	tb.Helper()
	timeout := time.After(10 * time.Second)
	for {
		select {
		case ev := <-events:
			if ev.Route.Dst == dst && ev.Deleted == deleted {
				return
			}
		case <-timeout:
			tb.Fatalf("route %s (deleted=%v) not seen within 10s", dst, deleted)
		}
	}
}

func median(ds []time.Duration) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2]
}

// cpuTicks is utime+stime of a process, in clock ticks (USER_HZ, 100/s).
func cpuTicks(tb testing.TB, pid int) int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		tb.Fatal(err)
	}
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+2:]))
	u, _ := strconv.ParseInt(f[11], 10, 64)
	s, _ := strconv.ParseInt(f[12], 10, 64)
	return u + s
}

func peakRSS(tb testing.TB, pid int) int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		tb.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "VmHWM:" {
			kb, _ := strconv.ParseInt(f[1], 10, 64)
			return kb
		}
	}
	tb.Fatal("no VmHWM")
	return 0
}

// BenchmarkEtcdHostGW5000 measures the daemon as an operator sees it: 5,000
// peer leases in a real etcd, the built twilld started in a fresh netns.
func BenchmarkEtcdHostGW5000(b *testing.B) {
	for range b.N {
		benchEtcdHostGW(b)
	}
}

func benchEtcdHostGW(b *testing.B) {
	c := newClusterOn(b, 1, netip.MustParsePrefix("192.168.0.0/16"))
	c.put("/twill.io/network/config", `{"Network":"100.64.0.0/10","Backend":{"Type":"host-gw"}}`)
	ctx := context.Background()
	for i := 0; i < benchPeers; i += 100 {
		var ops []clientv3.Op
		for j := i; j < min(i+100, benchPeers); j++ {
			k, v, _ := benchLease(j)
			ops = append(ops, clientv3.OpPut(k, v))
		}
		if _, err := c.cli.Txn(ctx).Then(ops...).Commit(); err != nil {
			b.Fatal(err)
		}
	}
	events := routeEvents(b, c.topo.Nodes[0].NS)
	b.ResetTimer()

	start := time.Now()
	b.Logf("daemon started at %s", start.UTC().Format("15:04:05.000"))
	d := c.startDaemon(0)
	timeout := time.After(60 * time.Second)
	for n := 0; n < benchPeers; {
		select {
		case ev := <-events:
			if !ev.Deleted {
				n++
			}
		case <-timeout:
			b.Fatalf("only %d of %d routes after 60s; log:\n%s", n, benchPeers, d.Output())
		}
	}
	startup := time.Since(start)

	// The floor under every lease-event figure: etcd committing a put.
	var puts []time.Duration
	for i := range benchSamples {
		t0 := time.Now()
		c.put(fmt.Sprintf("/bench/put-floor/%d", i), "x")
		puts = append(puts, time.Since(t0))
	}
	var adds, dels []time.Duration
	for i := range benchSamples {
		k, v, dst := benchLease(benchPeers + i)
		t0 := time.Now()
		c.put(k, v)
		waitRoute(b, events, dst, false)
		adds = append(adds, time.Since(t0))
	}
	for i := range benchSamples {
		k, _, dst := benchLease(benchPeers + i)
		t0 := time.Now()
		c.del(k)
		waitRoute(b, events, dst, true)
		dels = append(dels, time.Since(t0))
	}

	pid := d.cmd.Process.Pid
	if os.Getenv("TWILLD_LOG_LEVEL") == "debug" {
		lines := strings.Split(d.Output(), "\n")
		for _, l := range append(lines[:min(8, len(lines))], lines[max(0, len(lines)-6):]...) {
			b.Log(l)
		}
	}
	time.Sleep(2 * time.Second) // let the last events settle
	const idleFor = 15 * time.Second
	t0 := cpuTicks(b, pid)
	time.Sleep(idleFor)
	idle := float64(cpuTicks(b, pid)-t0) / 100 / idleFor.Seconds() * 100
	rss := float64(peakRSS(b, pid)) / 1024
	if st, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid)); err == nil {
		for _, l := range strings.Split(string(st), "\n") {
			if strings.HasPrefix(l, "Rss") || strings.HasPrefix(l, "VmHWM") || strings.HasPrefix(l, "VmRSS") {
				b.Log(l)
			}
		}
	}
	b.StopTimer()

	floor := kernelFloor(b)
	b.ReportMetric(float64(startup.Milliseconds()), "start-to-5000-routes-ms")
	b.ReportMetric(float64(median(adds).Microseconds())/1000, "lease-add-p50-ms")
	b.ReportMetric(float64(median(dels).Microseconds())/1000, "lease-del-p50-ms")
	b.ReportMetric(float64(median(puts).Microseconds())/1000, "etcd-put-p50-ms")
	b.ReportMetric(idle, "idle-cpu-%")
	b.ReportMetric(rss, "peak-rss-MiB")
	b.ReportMetric(float64(floor.Milliseconds()), "ip-batch-5000-routes-ms")
	b.Logf("start→5000 routes %s (ip -batch floor %s, ratio %.2f); lease add p50 %s, del p50 %s (etcd put alone p50 %s); idle CPU %.2f%%; peak RSS %.1f MiB",
		startup.Round(time.Millisecond), floor.Round(time.Millisecond), startup.Seconds()/floor.Seconds(),
		median(adds).Round(10*time.Microsecond), median(dels).Round(10*time.Microsecond), median(puts).Round(10*time.Microsecond), idle, rss)
}

// kernelFloor times `ip -batch` adding the same 5,000 routes in a fresh
// namespace: what the kernel alone costs.
func kernelFloor(b *testing.B) time.Duration {
	ns := netnstest.New(b, "floor")
	netnstest.IP(b, ns, "link", "add", "eth0", "type", "veth", "peer", "name", "eth0p")
	netnstest.IP(b, ns, "link", "set", "eth0", "up")
	netnstest.IP(b, ns, "link", "set", "eth0p", "up")
	netnstest.IP(b, ns, "addr", "add", "192.168.0.1/16", "dev", "eth0")
	var script strings.Builder
	for i := range benchPeers {
		_, _, dst := benchLease(i)
		gw := netip.AddrFrom4([4]byte{192, 168, byte(1 + i/250), byte(1 + i%250)})
		fmt.Fprintf(&script, "route add %s via %s dev eth0 proto 167\n", dst, gw)
	}
	path := filepath.Join(b.TempDir(), "routes.batch")
	if err := os.WriteFile(path, []byte(script.String()), 0o644); err != nil {
		b.Fatal(err)
	}
	t0 := time.Now()
	if out, err := exec.Command("ip", "-n", ns, "-batch", path).CombinedOutput(); err != nil {
		b.Fatalf("ip -batch: %v: %s", err, out)
	}
	return time.Since(t0)
}
