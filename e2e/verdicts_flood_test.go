package e2e

import (
	"fmt"
	"net"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
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

// verdictFlood: a flood of denied packets to one pod costs twilld bounded
// CPU, logs at most the log rule's rate, and says how many it did not log;
// connections between other pods of the node go on meanwhile.
func verdictFlood(t *testing.T, k *kubeCluster, pods []verdictPod) {
	from, to := pods[2], pods[1] // alpha/a2 → alpha/a1, denied, both on node1
	other, web := pods[8], pods[6]
	pid := k.daemons[0].cmd.Process.Pid
	metric := func(name string) float64 {
		v, err := strconv.ParseFloat(k.metric(0, name), 64)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	denied := func() float64 {
		_, body := nodeGet(t, k.topo.Nodes[0].NS, kubeHealthPort, "/metrics")
		for _, line := range strings.Split(body, "\n") {
			if strings.HasPrefix(line, `twill_netpol_packets_total{policy="alpha/db-deny-all",verdict="denied"}`) {
				v, _ := strconv.ParseFloat(strings.Fields(line)[1], 64)
				return v
			}
		}
		return 0
	}
	unlogged0, lost0, denied0 := metric("twill_netpol_denied_unlogged_packets_total"),
		metric("twill_netpol_log_records_lost_total"), denied()
	recordsTotal0 := logRecordsTotal(t, k)
	cpu0 := cpuTime(t, pid)

	// Connection times between two other pods of the node, before and
	// during the flood: reported, not asserted (speed is benchmarks').
	connect := func() (time.Duration, bool) {
		t0 := time.Now()
		ok := probe(other.netns, web.ip, 6, 8080, 2*time.Second)
		return time.Since(t0), ok
	}
	var before, during []time.Duration
	for range 20 {
		d, _ := connect()
		before = append(before, d)
	}
	sent := make(chan int)
	go func() { sent <- flood(t, from.netns, fmt.Sprintf("%s:9", to.ip)) }()
	// Meanwhile, other pods of the node keep connecting.
	var ok, tries int
	for deadline := time.Now().Add(floodFor - time.Second); time.Now().Before(deadline); tries++ {
		d, got := connect()
		if got {
			ok++
			during = append(during, d)
		}
		time.Sleep(200 * time.Millisecond)
	}
	n := <-sent
	if len(during) == 0 {
		during = []time.Duration{0}
	}
	cpu := cpuTime(t, pid) - cpu0
	time.Sleep(2 * time.Second) // the last records and counters
	logged := logRecordsTotal(t, k) - recordsTotal0
	unlogged := metric("twill_netpol_denied_unlogged_packets_total") - unlogged0
	lost := metric("twill_netpol_log_records_lost_total") - lost0
	drops := denied() - denied0
	t.Logf("flood: %d denied packets sent in %s (%.0f a second); the pod's chain dropped %.0f; logged %.0f, over the log rate and counted unlogged %.0f, lost %.0f; twilld used %s CPU (%.1f%% of one core); %d of %d connections between other pods got through meanwhile (median connect %s before, %s during)",
		n, floodFor, float64(n)/floodFor.Seconds(), drops, logged, unlogged, lost, cpu.Round(time.Millisecond),
		100*cpu.Seconds()/floodFor.Seconds(), ok, tries, median(before).Round(time.Microsecond), median(during).Round(time.Microsecond))

	if drops < float64(n)/2 {
		t.Errorf("the chain dropped %.0f of %d packets sent", drops, n)
	}
	if max := float64(10*(floodFor/time.Second+3) + 10); logged > max {
		t.Errorf("logged %.0f records in %s, above the rate of 10 a second (at most %.0f)", logged, floodFor, max)
	}
	// Every drop is either logged (or lost on the way) or counted unlogged.
	if diff := drops - (logged + lost + unlogged); diff < -float64(n)/100 || diff > float64(n)/100 {
		t.Errorf("drops %.0f != logged %.0f + lost %.0f + unlogged %.0f: the unlogged count does not say what was not logged", drops, logged, lost, unlogged)
	}
	if cpu > floodFor/4 {
		t.Errorf("twilld used %s of CPU during a %s flood: want it bounded by the log rate, well under a quarter of a core", cpu, floodFor)
	}
	if ok < tries-1 {
		t.Errorf("only %d of %d connections between other pods of the node got through during the flood", ok, tries)
	}
}

// logRecordsTotal is the denied records node1's verdict log read.
func logRecordsTotal(t *testing.T, k *kubeCluster) float64 {
	_, body := nodeGet(t, k.topo.Nodes[0].NS, kubeHealthPort, "/metrics")
	var sum float64
	for _, line := range strings.Split(body, "\n") {
		if strings.HasPrefix(line, `twill_netpol_log_records_total{verdict="denied"}`) {
			v, _ := strconv.ParseFloat(strings.Fields(line)[1], 64)
			sum += v
		}
	}
	return sum
}

// flood sends small UDP datagrams from netns to addr at floodRate for
// floodFor, and returns how many it sent.
func flood(t *testing.T, netns, addr string) int {
	var c net.Conn
	if err := ns.WithNetNSPath("/var/run/netns/"+netns, func(ns.NetNS) (err error) {
		c, err = net.Dial("udp", addr)
		return err
	}); err != nil {
		t.Error(err)
		return 0
	}
	defer c.Close()
	payload := make([]byte, 16)
	sent := 0
	start := time.Now()
	for tick := time.Duration(0); tick < floodFor; tick += 10 * time.Millisecond {
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
