package e2e

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// dataPlaneRun is how long each iperf3 measurement runs.
const dataPlaneRun = 3 * time.Second

// dataPlaneReps is how many pod→pod runs each figure takes.
const dataPlaneReps = 3

// BenchmarkDataPlane measures what a pod's traffic costs against its
// node's: TCP throughput (iperf3, one stream and four) from a pod on node1
// to a pod on node2, as a share of node1 to node2 over the same underlay.
// The runs alternate, node→node first and last (node, pod, node, pod, …,
// node): each pod→pod run is set against the mean of the two node→node
// runs beside it, so that the machine's load at that moment weighs on
// both sides of its share. The median share is reported, with the range.
func BenchmarkDataPlane(b *testing.B) {
	for _, tc := range []struct{ backend, conf string }{{"host-gw", netConfHostGW}, {"vxlan", netConfVXLAN}, {"wireguard", netConfWireGuard}} {
		b.Run(tc.backend, func(b *testing.B) {
			for range b.N {
				benchDataPlane(b, tc.backend, tc.conf)
			}
		})
	}
}

func benchDataPlane(b *testing.B, backendType, conf string) {
	c := newCluster(b, 2)
	if backendType == "wireguard" {
		b.Cleanup(c.stopWireGuardDevices)
	}
	c.put("/twill.io/network/config", conf)
	c.startDaemon(0)
	c.startDaemon(1)
	peer := c.env(1).Subnet
	waitFor(b, 10*time.Second, "node1's route to node2's pods", func() bool { return strings.Contains(c.routes(0), peer.String()) })
	podA, _ := c.addPod(0, "a")
	podB, ipB := c.addPod(1, "b")
	nodeA, nodeB, ipNodeB := c.topo.Nodes[0].NS, c.topo.Nodes[1].NS, c.topo.Nodes[1].Addr.Addr()
	nodeSrv := start(b, nodeB, filepath.Join(c.dir, "iperf-node.log"), "iperf3", "-s", "-p", "5201")
	defer nodeSrv.Stop(b)
	podSrv := start(b, podB, filepath.Join(c.dir, "iperf-pod.log"), "iperf3", "-s", "-p", "5201")
	defer podSrv.Stop(b)

	b.ResetTimer()
	for _, streams := range []int{1, 4} {
		nodes := []float64{iperf(b, nodeA, ipNodeB, streams)}
		var pods, shares []float64
		for range dataPlaneReps {
			pods = append(pods, iperf(b, podA, ipB, streams))
			nodes = append(nodes, iperf(b, nodeA, ipNodeB, streams))
			beside := (nodes[len(nodes)-2] + nodes[len(nodes)-1]) / 2
			shares = append(shares, pods[len(pods)-1]/beside*100)
		}
		share, lo, hi := medianF(shares), slices.Min(shares), slices.Max(shares)
		b.ReportMetric(medianF(nodes)/1e9, fmt.Sprintf("node-%dstream-Gbps", streams))
		b.ReportMetric(medianF(pods)/1e9, fmt.Sprintf("pod-%dstream-Gbps", streams))
		b.ReportMetric(share, fmt.Sprintf("pod-share-%dstream-%%", streams))
		b.ReportMetric(lo, fmt.Sprintf("pod-share-%dstream-min-%%", streams))
		b.ReportMetric(hi, fmt.Sprintf("pod-share-%dstream-max-%%", streams))
		b.Logf("%s, %d stream(s): node→node %s Gbit/s, pod→pod %s Gbit/s: share median %.0f%% (%.0f–%.0f%% over %d paired runs)",
			backendType, streams, gbps(nodes), gbps(pods), share, lo, hi, len(shares))
	}
}

// medianF is the median of xs (the mean of the middle two for an even
// count).
func medianF(xs []float64) float64 {
	s := slices.Sorted(slices.Values(xs))
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func gbps(xs []float64) string {
	out := make([]string, len(xs))
	for i, x := range xs {
		out[i] = fmt.Sprintf("%.2f", x/1e9)
	}
	return strings.Join(out, " ")
}

// iperf runs one iperf3 client in ns against server for dataPlaneRun with
// the given number of parallel streams and returns the bits per second the
// server received.
func iperf(b *testing.B, ns string, server netip.Addr, streams int) float64 {
	b.Helper()
	args := []string{"netns", "exec", ns, "iperf3", "-c", server.String(), "-p", "5201", "-J", "--connect-timeout", "1000",
		"-t", fmt.Sprint(int(dataPlaneRun.Seconds())), "-P", fmt.Sprint(streams)}
	var res struct {
		End struct {
			SumReceived struct {
				BitsPerSecond float64 `json:"bits_per_second"`
			} `json:"sum_received"`
		} `json:"end"`
	}
	var out []byte
	var err error
	// The server needs a moment to listen; before it does, iperf3 fails,
	// sometimes with an empty report and exit status 0.
	for range 50 {
		if out, err = exec.Command("ip", args...).CombinedOutput(); err == nil {
			if err = json.Unmarshal(out, &res); err == nil && res.End.SumReceived.BitsPerSecond > 0 {
				return res.End.SumReceived.BitsPerSecond
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	b.Fatalf("iperf3 from %s to %s: no throughput measured (%v):\n%s", ns, server, err, out)
	return 0
}

func TestMedianF(t *testing.T) {
	for _, tc := range []struct {
		xs   []float64
		want float64
	}{{[]float64{3, 1, 2}, 2}, {[]float64{90}, 90}, {[]float64{4, 1, 3, 2}, 2.5}} {
		if got := medianF(tc.xs); got != tc.want {
			t.Errorf("medianF(%v) = %v, want %v", tc.xs, got, tc.want)
		}
	}
}
