package e2e

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func execIn(netns string, args ...string) (string, error) {
	out, err := exec.Command("ip", append([]string{"netns", "exec", netns}, args...)...).CombinedOutput()
	return string(out), err
}

// floodRate and floodFor are the denied flood: UDP packets a second, to
// one pod, and for how long.
const (
	floodRate = 100_000
	floodFor  = 10 * time.Second
)

// floodResult is what a denied flood cost and what the log made of it.
type floodResult struct {
	d, took                time.Duration // asked for; the sender's real time (slower on a loaded machine)
	sent                   int
	drops, logged, lost    float64 // the chain's drops; records read; records lost
	unlogged               float64 // drops over the log rate, counted
	cpu                    time.Duration
	ok, tries              int // connections between two other pods meanwhile
	connBefore, connDuring time.Duration
}

// floodDenied floods to (denied by policy on node 0, whose chain counts
// against it) from from for d, while other connects to web, and
// reads node 0's twilld's metrics and CPU around it.
func floodDenied(tb testing.TB, k *kubeCluster, from, to, other, web verdictPod, policy string, d time.Duration) floodResult {
	pid := k.daemons[0].cmd.Process.Pid
	read := func() (drops, logged, lost, unlogged float64) {
		_, body := nodeGet(tb, k.topo.Nodes[0].NS, kubeHealthPort, "/metrics")
		for _, line := range strings.Split(body, "\n") {
			f := strings.Fields(line)
			if len(f) != 2 {
				continue
			}
			v, _ := strconv.ParseFloat(f[1], 64)
			switch f[0] {
			case `twill_netpol_packets_total{policy="` + policy + `",verdict="denied"}`:
				drops = v
			case `twill_netpol_log_records_total{verdict="denied"}`:
				logged = v
			case "twill_netpol_log_records_lost_total":
				lost = v
			case "twill_netpol_denied_unlogged_packets_total":
				unlogged = v
			}
		}
		return
	}
	connect := func() (time.Duration, bool) {
		t0 := time.Now()
		ok := probe(other.netns, web.ip, unix.IPPROTO_TCP, 8080, 2*time.Second)
		return time.Since(t0), ok
	}
	r := floodResult{d: d}
	var before, during []time.Duration
	for range 20 {
		d, _ := connect()
		before = append(before, d)
	}
	d0, l0, lost0, u0 := read()
	cpu0 := cpuTime(tb, pid)
	sent := make(chan int)
	t0 := time.Now()
	go func() { sent <- flood(tb, from.netns, fmt.Sprintf("%s:9", to.ip), d) }()
	for deadline := time.Now().Add(d - time.Second); time.Now().Before(deadline); r.tries++ {
		if d, got := connect(); got {
			r.ok++
			during = append(during, d)
		}
		time.Sleep(200 * time.Millisecond)
	}
	r.sent = <-sent
	r.took = time.Since(t0)
	r.cpu = cpuTime(tb, pid) - cpu0
	time.Sleep(2 * time.Second) // the last records and counters
	d1, l1, lost1, u1 := read()
	r.drops, r.logged, r.lost, r.unlogged = d1-d0, l1-l0, lost1-lost0, u1-u0
	r.connBefore = median(before)
	if len(during) > 0 {
		r.connDuring = median(during)
	}
	return r
}

func (r floodResult) String() string {
	return fmt.Sprintf("%d denied packets sent in %s (%.0f a second); the pod's chain dropped %.0f; logged %.0f, lost %.0f, over the log rate and counted unlogged %.0f; twilld used %s CPU (%.1f%% of one core); %d of %d connections between other pods got through meanwhile (median connect %s before, %s during)",
		r.sent, r.took.Round(time.Millisecond), float64(r.sent)/r.took.Seconds(), r.drops, r.logged, r.lost, r.unlogged, r.cpu.Round(time.Millisecond),
		100*r.cpu.Seconds()/r.took.Seconds(), r.ok, r.tries, r.connBefore.Round(time.Microsecond), r.connDuring.Round(time.Microsecond))
}

// verdictFlood: a flood of denied packets to one pod costs twilld bounded
// CPU, logs at most the log rule's rate, and says how many it did not log;
// connections between other pods of the node go on meanwhile.
func verdictFlood(t *testing.T, k *kubeCluster, pods []verdictPod) {
	// alpha/a2 → alpha/a1 (db: denied), beta/b2 → beta/b0 (allowed), all on node1.
	r := floodDenied(t, k, pods[2], pods[1], pods[8], pods[6], "alpha/db-deny-all", floodFor)
	t.Logf("flood: %s", r)
	if r.drops < float64(r.sent)/2 {
		t.Errorf("the chain dropped %.0f of %d packets sent", r.drops, r.sent)
	}
	// 10 a second while the flood lasts (and the 2 s after it), bursts
	// of 10: the machine's load can slow the sender past floodFor.
	if max := 10*(r.took.Seconds()+3) + 10; r.logged > max {
		t.Errorf("logged %.0f records in %s, above the rate of 10 a second (at most %.0f)", r.logged, r.took, max)
	}
	// Every drop is logged (or lost on the way) or counted unlogged.
	if diff := r.drops - (r.logged + r.lost + r.unlogged); diff < -float64(r.sent)/100 || diff > float64(r.sent)/100 {
		t.Errorf("drops %.0f != logged %.0f + lost %.0f + unlogged %.0f: the unlogged count does not say what was not logged", r.drops, r.logged, r.lost, r.unlogged)
	}
	if r.cpu > r.took/4 {
		t.Errorf("twilld used %s of CPU during a %s flood: want it bounded by the log rate, well under a quarter of a core", r.cpu, r.took)
	}
	if r.ok < r.tries-1 {
		t.Errorf("only %d of %d connections between other pods of the node got through during the flood", r.ok, r.tries)
	}
}

// BenchmarkPolicyVerdictLog measures the verdict log under a flood of
// 100,000 denied packets a second to one pod for 10 s: records logged,
// lost and counted unlogged, and twilld's CPU meanwhile, on one node
// running twilld --network-policy against a real apiserver, with a pod
// that a deny-all policy isolates and two that connect beside it; then the
// same flood with the log off, the cost of the flood alone.
func BenchmarkPolicyVerdictLog(b *testing.B) {
	for range b.N {
		k := newKubeCluster(b, 1, "host-gw")
		n := k.topo.Nodes[0]
		k.createNode(n.Name, podCIDR(0).String(), n.Addr.Addr(), nil)
		k.startKubeDaemon(0, "--network-policy")
		waitFor(b, 30*time.Second, "subnet.env", func() bool { _, err := os.Stat(k.subnetFile(0)); return err == nil })
		if _, err := k.api.AdminClient(b).ServiceAccounts("default").Create(context.Background(),
			&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			b.Fatal(err)
		}
		var pods []verdictPod
		for i, name := range []string{"target", "flooder", "client", "server"} {
			netns, ip := k.addPod(0, name)
			serve(b, netns)
			labels := map[string]string{"app": "open"}
			if i == 0 {
				labels["app"] = "closed"
			}
			createPod(b, k, "default", name, n.Name, ip, labels, nil)
			pods = append(pods, verdictPod{key: "default/" + name, netns: netns, ip: ip})
		}
		applyPolicy(b, k, `metadata: {namespace: default, name: closed}
spec: {podSelector: {matchLabels: {app: closed}}, policyTypes: [Ingress]}`)
		waitFor(b, 30*time.Second, "the target isolated", func() bool {
			return !probe(pods[2].netns, pods[0].ip, unix.IPPROTO_TCP, 80, 500*time.Millisecond)
		})
		d := floodFor
		if benchSmoke() {
			d = 2 * time.Second
		}
		b.ResetTimer()
		r := floodDenied(b, k, pods[1], pods[0], pods[2], pods[3], "default/closed", d)
		b.StopTimer()
		b.Logf("flood, logged: %s", r)
		// The same flood with the log off: what the flood itself costs
		// the node, apart from the log.
		k.daemons[0].Stop(b)
		k.startKubeDaemon(0, "--network-policy", "--network-policy-log-denied=false")
		waitFor(b, 30*time.Second, "twilld without the log", func() bool {
			out, _ := execIn(n.NS, "nft", "list", "table", "inet", "twill-policy")
			return strings.Contains(out, "closed") && !strings.Contains(out, " log ")
		})
		off := floodDenied(b, k, pods[1], pods[0], pods[2], pods[3], "default/closed", d)
		b.Logf("flood, log off: %s", off)
		b.ReportMetric(float64(off.connDuring.Microseconds()), "other-connect-during-log-off-µs")
		b.ReportMetric(100*off.cpu.Seconds()/off.took.Seconds(), "twilld-cpu-log-off-%")
		b.ReportMetric(float64(r.sent)/r.took.Seconds(), "denied-pkts/s")
		b.ReportMetric(r.logged, "records-logged")
		b.ReportMetric(r.lost, "records-lost")
		b.ReportMetric(r.unlogged, "packets-unlogged")
		b.ReportMetric(100*r.cpu.Seconds()/r.took.Seconds(), "twilld-cpu-%")
		b.ReportMetric(float64(r.connDuring.Microseconds()), "other-connect-during-µs")
		b.ReportMetric(float64(r.connBefore.Microseconds()), "other-connect-before-µs")
	}
}

// flood sends small UDP datagrams from netns to addr at floodRate for d,
// and returns how many it sent.
func flood(tb testing.TB, netns, addr string, d time.Duration) int {
	var c net.Conn
	if err := ns.WithNetNSPath("/var/run/netns/"+netns, func(ns.NetNS) (err error) {
		c, err = net.Dial("udp", addr)
		return err
	}); err != nil {
		tb.Error(err)
		return 0
	}
	defer c.Close()
	payload := make([]byte, 16)
	sent := 0
	start := time.Now()
	for tick := time.Duration(0); tick < d; tick += 10 * time.Millisecond {
		for range floodRate / 100 {
			if _, err := c.Write(payload); err == nil {
				sent++
			}
		}
		if d := time.Until(start.Add(tick + 10*time.Millisecond)); d > 0 {
			time.Sleep(d)
		}
	}
	return sent
}
