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
	"github.com/twill-net/twill/subnet"
)

const (
	benchPeers   = 5000
	benchSamples = 20
)

var benchNetwork = netip.MustParsePrefix("100.64.0.0/10")

// benchLease is the i-th synthetic peer: a /24 of 100.64.0.0/10 whose node
// has an address on the 192.168.0.0/16 underlay (and, for vxlan, its own
// VTEP MAC).
func benchLease(backendType string, i int) (key, value string, dst netip.Prefix) {
	dst = netip.PrefixFrom(subnet.NthSubnet(benchNetwork.Addr(), uint64(i+1), 24), 24)
	key = "/twill.io/network/subnets/" + subnet.SubnetKey(dst, netip.Prefix{})
	ip := benchPeerIP(i)
	if backendType == "vxlan" {
		return key, fmt.Sprintf(`{"PublicIP":%q,"BackendType":"vxlan","BackendData":{"VNI":1,"VtepMAC":%q}}`, ip, benchMAC(i)), dst
	}
	return key, fmt.Sprintf(`{"PublicIP":%q,"BackendType":"host-gw"}`, ip), dst
}

func benchPeerIP(i int) netip.Addr {
	return netip.AddrFrom4([4]byte{192, 168, byte(1 + i/250), byte(1 + i%250)})
}

func benchMAC(i int) string { return fmt.Sprintf("0a:b0:00:00:%02x:%02x", i>>8&0xff, i&0xff) }

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
		benchEtcd(b, "host-gw")
	}
}

// BenchmarkEtcdVXLAN5000 is the same with vxlan: 15,000 kernel objects
// (a route, a neighbour and an FDB entry per peer).
func BenchmarkEtcdVXLAN5000(b *testing.B) {
	for range b.N {
		benchEtcd(b, "vxlan")
	}
}

func benchEtcd(b *testing.B, backendType string) {
	c := newClusterOn(b, 1, netip.MustParsePrefix("192.168.0.0/16"))
	c.put("/twill.io/network/config", fmt.Sprintf(`{"Network":"100.64.0.0/10","Backend":{"Type":%q}}`, backendType))
	ctx := context.Background()
	for i := 0; i < benchPeers; i += 100 {
		var ops []clientv3.Op
		for j := i; j < min(i+100, benchPeers); j++ {
			k, v, _ := benchLease(backendType, j)
			ops = append(ops, clientv3.OpPut(k, v))
		}
		if _, err := c.cli.Txn(ctx).Then(ops...).Commit(); err != nil {
			b.Fatal(err)
		}
	}
	routes := watchRoutes(b, c.topo.Nodes[0].NS)
	b.ResetTimer()

	start := time.Now()
	b.Logf("daemon started at %s", start.UTC().Format("15:04:05.000"))
	d := c.startDaemon(0)
	if err := routes.waitCount(benchPeers, 60*time.Second); err != nil {
		b.Fatalf("%v; log:\n%s", err, d.Output())
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
		k, v, dst := benchLease(backendType, benchPeers+i)
		t0 := time.Now()
		c.put(k, v)
		routes.waitRoute(dst, false)
		adds = append(adds, time.Since(t0))
	}
	for i := range benchSamples {
		k, _, dst := benchLease(backendType, benchPeers+i)
		t0 := time.Now()
		c.del(k)
		routes.waitRoute(dst, true)
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

	if backendType == "vxlan" {
		// Routes are programmed after their neighbour and FDB entries, so
		// all three sets must be complete by now.
		for what, args := range map[string][]string{
			"neighbours": {"ip", "-n", c.topo.Nodes[0].NS, "neigh", "show", "dev", "twill.1", "nud", "permanent"},
			"fdb":        {"bridge", "-n", c.topo.Nodes[0].NS, "fdb", "show", "dev", "twill.1"},
		} {
			out, err := exec.Command(args[0], args[1:]...).CombinedOutput()
			if n := strings.Count(string(out), "\n"); err != nil || n < benchPeers {
				b.Fatalf("%s: %d entries (%v), want %d", what, n, err, benchPeers)
			}
		}
	}
	floor := kernelFloor(b, backendType)
	b.ReportMetric(float64(startup.Milliseconds()), "start-to-5000-routes-ms")
	b.ReportMetric(float64(median(adds).Microseconds())/1000, "lease-add-p50-ms")
	b.ReportMetric(float64(median(dels).Microseconds())/1000, "lease-del-p50-ms")
	b.ReportMetric(float64(median(puts).Microseconds())/1000, "etcd-put-p50-ms")
	b.ReportMetric(idle, "idle-cpu-%")
	b.ReportMetric(rss, "peak-rss-MiB")
	b.ReportMetric(float64(floor.Milliseconds()), "ip-batch-floor-ms")
	b.Logf("%s: start→all programmed %s (ip/bridge -batch floor %s, ratio %.2f); lease add p50 %s, del p50 %s (etcd put alone p50 %s); idle CPU %.2f%%; peak RSS %.1f MiB",
		backendType, startup.Round(time.Millisecond), floor.Round(time.Millisecond), startup.Seconds()/floor.Seconds(),
		median(adds).Round(10*time.Microsecond), median(dels).Round(10*time.Microsecond), median(puts).Round(10*time.Microsecond), idle, rss)
}

// kernelFloor times `ip -batch` (and for vxlan `bridge -batch`) adding the
// same objects in a fresh namespace: what the kernel alone costs.
func kernelFloor(b *testing.B, backendType string) time.Duration {
	ns := netnstest.New(b, "floor")
	netnstest.Uplink(b, ns, "192.168.0.1/16")
	var routes, fdb strings.Builder
	if backendType == "vxlan" {
		netnstest.IP(b, ns, "link", "add", "twill.1", "type", "vxlan", "id", "1", "dev", "eth0", "local", "192.168.0.1", "dstport", "8472", "nolearning")
		netnstest.IP(b, ns, "link", "set", "twill.1", "up")
	}
	for i := range benchPeers {
		_, _, dst := benchLease(backendType, i)
		if backendType == "vxlan" {
			fmt.Fprintf(&routes, "neigh add %s lladdr %s dev twill.1 nud permanent\n", dst.Addr(), benchMAC(i))
			fmt.Fprintf(&routes, "route add %s via %s dev twill.1 onlink proto 167\n", dst, dst.Addr())
			fmt.Fprintf(&fdb, "fdb add %s dev twill.1 dst %s self permanent\n", benchMAC(i), benchPeerIP(i))
		} else {
			fmt.Fprintf(&routes, "route add %s via %s dev eth0 proto 167\n", dst, benchPeerIP(i))
		}
	}
	dir := b.TempDir()
	run := func(tool, script string) {
		path := filepath.Join(dir, tool+".batch")
		if err := os.WriteFile(path, []byte(script), 0o644); err != nil {
			b.Fatal(err)
		}
		if out, err := exec.Command(tool, "-n", ns, "-batch", path).CombinedOutput(); err != nil {
			b.Fatalf("%s -batch: %v: %s", tool, err, out)
		}
	}
	t0 := time.Now()
	if fdb.Len() > 0 {
		run("bridge", fdb.String())
	}
	run("ip", routes.String())
	return time.Since(t0)
}
