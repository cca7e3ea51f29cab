package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"

	"github.com/twill-net/twill/backend/wireguard"
	"github.com/twill-net/twill/backend/wireguard/uapi"
	twcluster "github.com/twill-net/twill/lab/cluster"
	"github.com/twill-net/twill/plugin/antispoof"
	"github.com/twill-net/twill/testsupport/netnstest"
)

// dataPlaneRun is how long each iperf3 measurement runs (1 s in smoke).
func dataPlaneRun() time.Duration {
	if benchSmoke() {
		return time.Second
	}
	return 3 * time.Second
}

// dataPlaneReps is how many pod→pod runs each figure takes (1 in smoke).
func dataPlaneReps() int {
	if benchSmoke() {
		return 1
	}
	return 3
}

// BenchmarkDataPlane measures what a pod's traffic costs against its
// node's: TCP throughput (iperf3, one stream and four) from a pod on node1
// to a pod on node2, as a share of node1 to node2 over the same underlay.
// The runs alternate, node→node first and last (node, pod, node, pod, …,
// node): each pod→pod run is set against the mean of the two node→node
// runs beside it, so that the machine's load at that moment weighs on
// both sides of its share. The median share is reported, with the range.
//
// The flannel-* cases are the same measure with flanneld itself (the
// version tools/flannel pins, on etcd) and pods wired as flannel's CNI
// plugin wires them (bridge and host-local): what a flannel user has
// today, on the same machine in the same run.
func BenchmarkDataPlane(b *testing.B) {
	for _, tc := range []struct{ backend, conf string }{{"host-gw", netConfHostGW}, {"vxlan", netConfVXLAN}, {"wireguard", netConfWireGuard}} {
		b.Run(tc.backend, func(b *testing.B) {
			for range b.N {
				benchDataPlane(b, tc.backend, tc.conf)
			}
		})
	}
	// The same host-gw pair with the anti-spoofing check taken out, beside
	// the case with it: what the check costs.
	b.Run("host-gw-without-anti-spoofing", func(b *testing.B) {
		for range b.N {
			benchDataPlaneWithout(b, "host-gw", netConfHostGW)
		}
	})
	for _, backend := range []string{"host-gw", "vxlan"} {
		b.Run("flannel-"+backend, func(b *testing.B) {
			for range b.N {
				benchFlannelDataPlane(b, backend)
			}
		})
	}
	b.Run("wireguard-tunnel", func(b *testing.B) {
		for range b.N {
			benchWireGuardTunnel(b)
		}
	})
}

// benchWireGuardTunnel is the wireguard case's floor: wireguard-go's
// device at twill's pinned version (twill-wg, run and configured by hand:
// no twilld, no pod), one on each node, each on its node's core, and
// iperf3 from node1 to node2's tunnel address. Its share of node→node is
// what userspace WireGuard itself costs; the wireguard case's share
// against it is what twill's pod path adds.
func benchWireGuardTunnel(b *testing.B) {
	c := newCluster(b, 2)
	keys := make([]wgtypes.Key, 2)
	for i := range keys {
		keys[i], _ = wgtypes.GeneratePrivateKey()
	}
	port := wireguard.DefaultListenPort
	tunnelIP := func(i int) netip.Addr { return netip.AddrFrom4([4]byte{10, 98, 0, byte(i + 1)}) }
	for i, n := range c.topo.Nodes {
		sock := filepath.Join(c.dir, fmt.Sprintf("wg%d.sock", i))
		dev := start(b, n.NS, filepath.Join(c.dir, fmt.Sprintf("wg%d.log", i)), c.bin+"/twill-wg", "--name", "wg-floor", "--socket", sock, "--mtu", "1420")
		b.Cleanup(func() { dev.Stop(b) })
		cl := &uapi.Client{Path: sock}
		waitFor(b, 10*time.Second, "node's twill-wg serving", func() bool { _, err := cl.Get(context.Background()); return err == nil })
		other := 1 - i
		cfg := wgtypes.Config{PrivateKey: &keys[i], ListenPort: &port, Peers: []wgtypes.PeerConfig{{
			PublicKey: keys[other].PublicKey(), Endpoint: net.UDPAddrFromAddrPort(netip.AddrPortFrom(c.topo.Nodes[other].Addr.Addr(), uint16(port))),
			AllowedIPs: []net.IPNet{{IP: tunnelIP(other).AsSlice(), Mask: net.CIDRMask(32, 32)}}}}}
		if err := cl.Set(context.Background(), cfg); err != nil {
			b.Fatal(err)
		}
		netnstest.IP(b, n.NS, "addr", "add", tunnelIP(i).String()+"/24", "dev", "wg-floor")
		netnstest.IP(b, n.NS, "link", "set", "wg-floor", "up")
		pinProcess(b, fmt.Sprint(dev.cmd.Process.Pid), i)
	}
	nodeA, nodeB := c.topo.Nodes[0].NS, c.topo.Nodes[1].NS
	waitFor(b, 10*time.Second, "node1 reaching node2 through the tunnel", func() bool { return ping(nodeA, tunnelIP(1)) == nil })
	measureDataPlane(b, c, "wireguard-go tunnel (no twilld, no pod)", nodeA, nodeB, tunnelIP(1))
}

func benchDataPlane(b *testing.B, backendType, conf string) {
	benchPods(b, backendType, conf, false)
}

// benchDataPlaneWithout is benchDataPlane with the nodes' anti-spoofing
// table (the CNI plugin's) deleted once the pods are wired.
func benchDataPlaneWithout(b *testing.B, backendType, conf string) {
	benchPods(b, backendType, conf, true)
}

func benchPods(b *testing.B, backendType, conf string, noAntiSpoofing bool) {
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
	name := backendType
	if noAntiSpoofing {
		name += " without anti-spoofing"
		for _, n := range c.topo.Nodes {
			if out, err := execIn(n.NS, "nft", "delete", "table", "inet", antispoof.TableName); err != nil {
				b.Fatalf("deleting the anti-spoofing table: %v: %s", err, out)
			}
		}
	}
	if backendType == "wireguard" {
		// The userspace devices move the packets: each on its node's core.
		for i, n := range c.topo.Nodes {
			raw, err := os.ReadFile(wireguard.PIDFile(twcluster.NodeDir(c.dir, n.Name), wireguard.DeviceName))
			if err != nil {
				b.Fatal(err)
			}
			pinProcess(b, strings.TrimSpace(string(raw)), i)
		}
	}
	measureDataPlane(b, c, name, podA, podB, ipB)
}

// benchFlannelDataPlane is benchDataPlane with flanneld and flannel's pod
// wiring in twill's place.
func benchFlannelDataPlane(b *testing.B, backend string) {
	c := &flannelCluster{cluster: newCluster(b, 2), flanneld: flanneldBinary(b), flannels: map[int]*proc{}}
	c.put(flannelPrefix+"/config", fmt.Sprintf(`{"Network":"10.50.0.0/16","Backend":{"Type":%q}}`, backend))
	c.startFlannel(0)
	c.startFlannel(1)
	podA, podB := c.addPod(0, "a", false), c.addPod(1, "b", false)
	waitFor(b, 10*time.Second, "the pod on node1 to reach the pod on node2", func() bool { return ping(podA.ns, podB.ip) == nil })
	measureDataPlane(b, c.cluster, "flannel "+backend, podA.ns, podB.ns, podB.ip)
}

// measureDataPlane runs the paired iperf3 measures of BenchmarkDataPlane
// between c's first two nodes and between pods podA (on node1) and podB
// (on node2, at ipB), and reports them.
//
// Each node has a core of its own, as each host has its own CPUs: the
// iperf3 processes of node1 and its pod run on core 0, node2's on core 1,
// and each node's eth0 hands the packets it receives to its node's core
// (RPS), as a host's NIC raises its interrupts on that host. Otherwise
// the veth under eth0 would do the receiving node's kernel work on the
// sender's core, and the scheduler would spread both nodes over both
// cores differently from run to run.
func measureDataPlane(b *testing.B, c *cluster, what, podA, podB string, ipB netip.Addr) {
	if runtime.NumCPU() < 2 {
		b.Fatalf("the data-plane benchmark gives each of its two nodes a core: this machine has %d", runtime.NumCPU())
	}
	nodeA, nodeB, ipNodeB := c.topo.Nodes[0].NS, c.topo.Nodes[1].NS, c.topo.Nodes[1].Addr.Addr()
	for i := range 2 {
		mask := fmt.Sprintf("%x", 1<<i)
		cmd := exec.Command("ip", "netns", "exec", c.topo.Nodes[i].NS, "sh", "-c", "echo "+mask+" > /sys/class/net/eth0/queues/rx-0/rps_cpus")
		if out, err := cmd.CombinedOutput(); err != nil {
			b.Fatalf("steering node%d's eth0 to core %d: %v: %s", i+1, i, err, out)
		}
	}
	nodeSrv := start(b, nodeB, filepath.Join(c.dir, "iperf-node.log"), "taskset", "-c", "1", "iperf3", "-s", "-p", "5201")
	defer nodeSrv.Stop(b)
	if podB != nodeB { // a tunnel between the nodes has its far end on the node server
		podSrv := start(b, podB, filepath.Join(c.dir, "iperf-pod.log"), "taskset", "-c", "1", "iperf3", "-s", "-p", "5201")
		defer podSrv.Stop(b)
	}

	b.ResetTimer()
	for _, streams := range []int{1, 4} {
		nodes := []float64{iperf(b, nodeA, ipNodeB, streams)}
		var pods, shares []float64
		for range dataPlaneReps() {
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
			what, streams, gbps(nodes), gbps(pods), share, lo, hi, len(shares))
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

// iperf runs one iperf3 client in ns, on core 0, against server for
// dataPlaneRun with the given number of parallel streams and returns the
// bits per second the server received.
func iperf(b *testing.B, ns string, server netip.Addr, streams int) float64 {
	b.Helper()
	args := []string{"netns", "exec", ns, "taskset", "-c", "0", "iperf3", "-c", server.String(), "-p", "5201", "-J", "--connect-timeout", "1000",
		"-t", fmt.Sprint(int(dataPlaneRun().Seconds())), "-P", fmt.Sprint(streams)}
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

// pinProcess puts every thread of process pid on core.
func pinProcess(b *testing.B, pid string, core int) {
	b.Helper()
	if out, err := exec.Command("taskset", "-a", "-p", "-c", fmt.Sprint(core), pid).CombinedOutput(); err != nil {
		b.Fatalf("taskset -a -p -c %d %s: %v: %s", core, pid, err, out)
	}
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
