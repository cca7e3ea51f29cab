package policy

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/twill-net/twill/testsupport/netnstest"
)

// The two pods of BenchmarkPolicyDataPath, both in scale()'s ns0 on n0:
// server is p0 (app0, which ten policies select) and client p30 (role r2,
// which pol100 lets in on port 80).
const (
	benchServer = "10.244.0.2"
	benchClient = "10.244.0.12"
	benchPort   = "80"
)

// dataPath is the node and the two pods a data-path benchmark measures.
type dataPath struct {
	n              *node
	server, client string
}

// BenchmarkPolicyDataPath: what 500 policies cost a pod's traffic. Two pods
// on one node namespace, the server selected by ten of scale()'s 500
// policies and the client let in by one of them, are measured with twill's
// table for those policies in the node's forward hook and with no table at
// all, in alternation (none, policies, none, …, none), each policy run set
// against the mean of the runs beside it: TCP connection round trips (a
// new connection, one byte there and back: every SYN walks the server's
// chain) and throughput (iperf3, one stream: established packets meet the
// table's first rule), conntrack on in both.
func BenchmarkPolicyDataPath(b *testing.B) {
	benchDataPath(b, scale(), benchClient, "500-policies")
}

// BenchmarkPolicyDataPathAtScale is BenchmarkPolicyDataPath at 10,000 pods
// and 2,000 policies (scaleOf), and with 100 ClusterNetworkPolicies beside
// them; under make bench-smoke, 2,000 pods, 400 policies and 20. The
// server is p0 again (app0 in ns0, which four policies select), the client
// the first pod of ns0 on n0 that one of them lets in (scaleClient).
func BenchmarkPolicyDataPathAtScale(b *testing.B) {
	atScale(b, func(b *testing.B, s Snapshot, size scaleSize) {
		what := fmt.Sprintf("%d-policies-%d-cnps", size.policies, size.cnps)
		benchDataPath(b, s, scaleClient(size.pods, size.policies), what)
	})
}

// scaleClient is the address of the first pod of scaleOf(pods, policies)
// in ns0 on n0, but p0, whose role a policy selecting app0 lets in from its
// own namespace on port 80 (the policies name a role, r0–r6, by their
// index).
func scaleClient(pods, policies int) string {
	namespaces, apps := max(pods/100, 1), max(pods/20, 1)
	for i := 1; i < pods; i++ {
		if i%3 != 0 || i%namespaces != 0 {
			continue
		}
		for j := 0; j < policies; j += apps {
			if j%namespaces == 0 && j%7 == i%7 {
				return scalePodIPOf(pods, i)
			}
		}
	}
	panic(fmt.Sprintf("no client in a cluster of %d pods and %d policies", pods, policies))
}

// BenchmarkClusterPolicyDataPath is BenchmarkPolicyDataPath with
// scaleCluster's 50 ClusterNetworkPolicies too: the server and the client
// are each selected by nine Admin policies, whose rules their connection
// walks past before NetworkPolicy lets it in.
func BenchmarkClusterPolicyDataPath(b *testing.B) {
	benchDataPath(b, scaleCluster(), benchClient, "500-policies-50-cnps")
}

// benchDataPath measures s's table against none, between benchServer and
// client; what names it in the metrics.
func benchDataPath(b *testing.B, s Snapshot, client, what string) {
	n := newNode(b)
	n.pod(benchServer)
	n.pod(client)
	dp := dataPath{n: n, server: benchServer, client: client}
	// Each run's 2,000 connections leave the client's ports in TIME_WAIT
	// for a minute: with many runs (TWILL_DATAPATH_REPS) they ran out.
	if out, err := netnstest.Exec(n.pods[client], "sysctl", "-qw", "net.ipv4.tcp_tw_reuse=1", "net.ipv4.ip_local_port_range=1024 65535"); err != nil {
		b.Fatalf("the client's ports: %v: %s", err, out)
	}
	// Conntrack runs in both: on a node it always does (kube-proxy and
	// twill's masquerade use it), and the table's first rule needs it.
	if out, err := netnstest.Exec(n.name, "nft", "add table inet bench; add chain inet bench forward { type filter hook forward priority 0; }; add rule inet bench forward ct state established accept"); err != nil {
		b.Fatalf("conntrack in the node namespace: %v: %s", err, out)
	}
	rs := Compile(s).Ruleset
	on := func(enforced bool) {
		if !enforced {
			if _, err := n.tb.Delete(); err != nil {
				b.Fatal(err)
			}
			return
		}
		if _, err := n.tb.Sync(rs, true); err != nil {
			b.Fatal(err)
		}
	}
	// The table is in force: it lets the client in on port 80 only.
	on(true)
	if n.reaches(client, benchServer) {
		b.Fatalf("a ping from the client reaches the server through %s that allow TCP port 80 alone", what)
	}
	on(false)
	if !n.reaches(client, benchServer) {
		b.Fatal("the client cannot ping the server with no policy table")
	}
	for b.Loop() {
		lat := alternate(b, on, func() float64 { return connectRTT(b, dp) })
		on(false)
		tput := alternate(b, on, func() float64 { return iperfOnce(b, dp) })
		b.ReportMetric(lat.none, "connect-rtt-none-p50-µs")
		b.ReportMetric(lat.with, "connect-rtt-"+what+"-p50-µs")
		b.ReportMetric(lat.median, "connect-rtt-ratio-%")
		b.ReportMetric(tput.none/1e9, "tput-none-Gbps")
		b.ReportMetric(tput.with/1e9, "tput-"+what+"-Gbps")
		b.ReportMetric(tput.median, "tput-share-%")
		b.Logf("%s against none, pod to pod on one node: connection round trip p50 %.0f µs against %.0f µs (%.0f%%, %.0f–%.0f%%); one TCP stream %.2f Gbit/s against %.2f (%.0f%%, %.0f–%.0f%%), each a median of %d runs",
			what, lat.with, lat.none, lat.median, lat.lo, lat.hi, tput.with/1e9, tput.none/1e9, tput.median, tput.lo, tput.hi, dataPathReps())
	}
}

// dataPathReps is how many runs with the policies each figure takes: one
// under make bench-smoke (TWILL_BENCH_SMOKE), which checks that it runs;
// TWILL_DATAPATH_REPS runs, when set (the median steadies with more; the
// range does not narrow: the machine's noise is most of a new
// connection's cost).
func dataPathReps() int {
	if n, err := strconv.Atoi(os.Getenv("TWILL_DATAPATH_REPS")); err == nil && n > 0 {
		return n
	}
	if os.Getenv("TWILL_BENCH_SMOKE") != "" {
		return 1
	}
	return 3
}

type paired struct{ none, with, median, lo, hi float64 }

// alternate measures with the table off and on in turn, off first and
// last, and gives the medians and each on-run's share of the mean of the
// off-runs beside it (median, range).
func alternate(b *testing.B, on func(bool), measure func() float64) paired {
	on(false)
	none := []float64{measure()}
	var with, shares []float64
	for range dataPathReps() {
		on(true)
		with = append(with, measure())
		on(false)
		none = append(none, measure())
		shares = append(shares, with[len(with)-1]/((none[len(none)-2]+none[len(none)-1])/2)*100)
	}
	return paired{none: median(none), with: median(with), median: median(shares), lo: slices.Min(shares), hi: slices.Max(shares)}
}

func median(xs []float64) float64 {
	s := slices.Sorted(slices.Values(xs))
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// connectRTT is the median time, in µs, of 2,000 connections from the
// client to an echo server on the server pod: connect, one byte there and
// back, close.
func connectRTT(b *testing.B, dp dataPath) float64 {
	var ln net.Listener
	if err := ns.WithNetNSPath("/var/run/netns/"+dp.n.pods[dp.server], func(ns.NetNS) (err error) {
		ln, err = net.Listen("tcp", net.JoinHostPort(dp.server, benchPort))
		return err
	}); err != nil {
		b.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				io.Copy(c, c)
			}()
		}
	}()
	var took []float64
	err := ns.WithNetNSPath("/var/run/netns/"+dp.n.pods[dp.client], func(ns.NetNS) error {
		buf := make([]byte, 1)
		for range 2000 {
			start := time.Now()
			c, err := net.DialTimeout("tcp", net.JoinHostPort(dp.server, benchPort), 2*time.Second)
			if err != nil {
				return err
			}
			_ = c.SetDeadline(time.Now().Add(2 * time.Second))
			_, err = c.Write(buf)
			if err == nil {
				_, err = io.ReadFull(c, buf)
			}
			c.Close()
			if err != nil {
				return err
			}
			took = append(took, float64(time.Since(start).Microseconds()))
		}
		return nil
	})
	if err != nil {
		b.Fatalf("connecting from %s to %s:%s: %v", dp.client, dp.server, benchPort, err)
	}
	return median(took)
}

// iperfOnce runs iperf3 for 3 s, one stream, from the client to a server
// on the server pod, and returns the bits per second received.
func iperfOnce(b *testing.B, dp dataPath) float64 {
	srv := exec.Command("ip", "netns", "exec", dp.n.pods[dp.server], "iperf3", "-s", "-1", "-p", benchPort)
	if err := srv.Start(); err != nil {
		b.Fatalf("iperf3 -s: %v", err)
	}
	defer func() {
		_ = srv.Process.Kill()
		_ = srv.Wait()
	}()
	var res struct {
		End struct {
			SumReceived struct {
				BitsPerSecond float64 `json:"bits_per_second"`
			} `json:"sum_received"`
		} `json:"end"`
	}
	var out string
	var err error
	// The server needs a moment to listen.
	for range 50 {
		out, err = netnstest.Exec(dp.n.pods[dp.client], "iperf3", "-c", dp.server, "-p", benchPort, "-J", "-t", "3", "--connect-timeout", "1000")
		if err == nil {
			if err = json.Unmarshal([]byte(out), &res); err == nil && res.End.SumReceived.BitsPerSecond > 0 {
				return res.End.SumReceived.BitsPerSecond
			}
			err = errors.New("no throughput in the report")
		}
		time.Sleep(100 * time.Millisecond)
	}
	b.Fatalf("iperf3 from %s to %s: %v\n%s", dp.client, dp.server, err, out)
	return 0
}
