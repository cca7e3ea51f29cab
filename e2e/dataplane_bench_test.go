package e2e

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// dataPlaneRun is how long each iperf3 measurement runs.
const dataPlaneRun = 4 * time.Second

// BenchmarkDataPlane measures what a pod's traffic costs against its
// node's: TCP throughput (iperf3, one stream and four) from a pod on node1
// to a pod on node2, as a share of node1 to node2 over the same underlay,
// for host-gw and vxlan (targets: 90% and 75%). Both paths are measured
// twice, interleaved, and the better run of each kept, so that a moment of
// load on the shared machine does not decide the ratio.
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
		var node, pod float64
		for range 2 {
			node = max(node, iperf(b, nodeA, ipNodeB, streams))
			pod = max(pod, iperf(b, podA, ipB, streams))
		}
		share := pod / node * 100
		b.ReportMetric(node/1e9, fmt.Sprintf("node-%dstream-Gbps", streams))
		b.ReportMetric(pod/1e9, fmt.Sprintf("pod-%dstream-Gbps", streams))
		b.ReportMetric(share, fmt.Sprintf("pod-share-%dstream-%%", streams))
		b.Logf("%s, %d stream(s): node→node %.2f Gbit/s, pod→pod %.2f Gbit/s: %.0f%%", backendType, streams, node/1e9, pod/1e9, share)
	}
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
