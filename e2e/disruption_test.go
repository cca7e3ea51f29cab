package e2e

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/twill-net/twill/backend/wireguard"
	"github.com/twill-net/twill/lab"
)

// disruptEvent is one event of a node's life, done while connections are
// held.
type disruptEvent struct {
	name string
	do   func(t *testing.T, c *cluster)
	// control: the event cuts the data plane on purpose, and the harness
	// must see connections break (else it could not see a real break).
	control bool
}

// TestEtcdDisruption: for each backend, two nodes of two pods each, every
// pod holding a long-lived TCP connection to every pod of the other node (a
// heartbeat every 100 ms; a reset, a close or a stall over 1 s breaks it),
// a stream of new connections and UDP echoes, through the events of a
// node's life in etcd mode: twilld stopped and started again, killed with
// SIGKILL and started again, etcd restarted, and with wireguard a key
// rotation. No held
// connection may break. The table (event × backend) is printed.
func TestEtcdDisruption(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ backend, conf string }{{"host-gw", netConfHostGW}, {"vxlan", netConfVXLAN}, {"wireguard", netConfWireGuard}} {
		t.Run(tc.backend, func(t *testing.T) {
			beside(t)
			c := newCluster(t, 2)
			if tc.backend == "wireguard" {
				t.Cleanup(c.stopWireGuardDevices)
				// A stall is then told in full: each reconcile, each
				// peer put back (one of 15 s after a key rotation, once
				// in a fresh run, said too little at info).
				c.daemonExtra = []string{"--log-level=debug"}
			}
			c.put("/twill.io/network/config", tc.conf)
			for i := range c.topo.Nodes {
				c.startDaemon(i)
			}
			for i := range c.topo.Nodes {
				c.env(i) // subnet.env written
			}
			var from []lab.Vantage
			var to []lab.Target
			node := map[string]int{}
			for i := range c.topo.Nodes {
				for j := range 2 {
					name := fmt.Sprintf("h%d%d", i+1, j+1)
					podNS, ip := c.addPod(i, name)
					labEchoIn(t, podNS)
					from = append(from, lab.Vantage{Name: name, NetNS: "/var/run/netns/" + podNS})
					to = append(to, lab.Target{Name: name, Addr: netip.AddrPortFrom(ip, lab.EchoPort)})
					node[name] = i
				}
			}
			waitFor(t, 20*time.Second, "every pod reaching every other node's pods", func() bool {
				for _, v := range from {
					for _, tg := range to {
						if node[v.Name] != node[tg.Name] && !reachesEcho(v.NetNS, tg.Addr) {
							return false
						}
					}
				}
				return true
			})
			events := []disruptEvent{
				{name: "steady (no event)", do: func(*testing.T, *cluster) {}},
				{name: "twilld restart (SIGTERM, start)", do: func(t *testing.T, c *cluster) { restartDaemon(t, c, 0, false) }},
				{name: "twilld kill -9, start", do: func(t *testing.T, c *cluster) { restartDaemon(t, c, 0, true) }},
				{name: "twilld restart on the other node", do: func(t *testing.T, c *cluster) { restartDaemon(t, c, 1, false) }},
				{name: "etcd restart", do: restartEtcd},
			}
			if tc.backend == "wireguard" {
				events = append(events, disruptEvent{name: "key rotation", do: rotateKey})
			}
			events = append(events, disruptEvent{name: "control: node1 forwards nothing for 1.5 s", do: blackhole, control: true})
			var cp *capture
			if tc.backend == "wireguard" {
				cp = startCapture(t, c.topo.Underlay)
			}
			d := startDisruption(t, tc.backend, c.bin, from, to, func(v lab.Vantage, tg lab.Target) bool { return node[v.Name] != node[tg.Name] })
			d.diagnose = func(event string, since time.Time) {
				for i, dm := range c.daemons {
					lines := logSince(dm.Output(), since, 200)
					t.Logf("%s broke held connections; node%d's twilld from %s on (%d lines):\n%s", event, i+1, since.Format("15:04:05.000"), len(lines), strings.Join(lines, "\n"))
					if tc.backend == "wireguard" {
						t.Logf("node%d's WireGuard device now: %s", i+1, c.wgSummary(i))
					}
				}
			}
			for _, ev := range events {
				d.event(ev.name, ev.control, func() { ev.do(t, c) })
			}
			d.finish()
			if cp != nil {
				frames := cp.stop()
				nodes := map[netip.Addr]bool{}
				for _, n := range c.topo.Nodes {
					nodes[n.Addr.Addr()] = true
				}
				var pods []netip.Addr
				for _, tg := range to {
					pods = append(pods, tg.Addr.Addr())
				}
				wg, err := onlyWireGuard(frames, nodes, pods, []byte(lab.HoldMarker), wireguard.DefaultListenPort)
				if err != nil {
					t.Errorf("through the events: %v", err)
				}
				t.Logf("the underlay through every event: %d frames captured, %d WireGuard between nodes, 0 with a pod address or the payload in clear", len(frames), wg)
				if wg < 1000 {
					t.Errorf("only %d WireGuard frames captured: the capture missed the traffic", wg)
				}
			}
		})
	}
}

// disruption holds connections between pods while events happen, and
// says what each event cost.
type disruption struct {
	t       *testing.T
	backend string
	run     *lab.HoldRun
	cancel  context.CancelFunc
	rows    []disruptRow
	// diagnose, when set, logs what the nodes' daemons said from since
	// on, for an event that broke held connections it must not break.
	diagnose func(event string, since time.Time)
}

type disruptRow struct {
	event   string
	control bool
	stalls  string // why the event may stall held connections (documented)
	sum     lab.HoldSummary
}

// startDisruption starts holding every pair (lab hold in each vantage
// point) and waits until every connection is up.
func startDisruption(t *testing.T, backend, binDir string, from []lab.Vantage, to []lab.Target, pairs func(lab.Vantage, lab.Target) bool) *disruption {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	d := &disruption{t: t, backend: backend, cancel: cancel, run: lab.StartHold(ctx, binDir, from, to, pairs, 30*time.Minute)}
	t.Cleanup(cancel)
	time.Sleep(2 * time.Second)
	return d
}

// event does an event; what follows it for 3 s is the event's too, and
// then until the held pairs are well again (see settle).
func (d *disruption) event(name string, control bool, do func()) { d.record(name, control, "", do) }

// eventStalls is event for one that stops the data plane for a while, as
// the docs say (why): the held connections it breaks are reported, not
// failed on; the events after it must break none.
func (d *disruption) eventStalls(name, why string, do func()) { d.record(name, false, why, do) }

func (d *disruption) record(name string, control bool, stalls string, do func()) {
	start := time.Now()
	do()
	time.Sleep(2 * time.Second) // settle waits a second more at least
	r := disruptRow{event: name, control: control, stalls: stalls, sum: d.run.Summary(start, d.settle(time.Now()))}
	d.rows = append(d.rows, r)
	if !control && stalls == "" && r.sum.Broken > 0 && d.diagnose != nil {
		d.diagnose(name, start.Add(-time.Second))
	}
}

// settleFor bounds how long an event's row waits for the pairs to be
// well again.
const settleFor = 15 * time.Second

// settle returns once a second of windows after from shows the held
// pairs well (nothing broken, failed or lost, no stall over 5 heartbeats),
// or after settleFor: a stall that outlasts an event's 3 s is counted in
// its row, not in the next event's.
func (d *disruption) settle(from time.Time) time.Time {
	last := from
	for {
		time.Sleep(time.Second)
		now := time.Now()
		s := d.run.Summary(last, now)
		if s.Pairs > 0 && s.Broken == 0 && s.NewFail == 0 && s.UDPLost == 0 && s.Stall < 5*lab.HoldBeat || now.Sub(from) > settleFor {
			return now
		}
		last = now
	}
}

// finish stops holding, prints the table and fails for each event (but
// the controls and those documented to stall) that broke a held
// connection.
func (d *disruption) finish() {
	t := d.t
	t.Helper()
	d.cancel()
	d.run.Wait() // cancelled: its errors are the kill's
	var b strings.Builder
	fmt.Fprintf(&b, "%s: held connections through each event\n| event | pairs | broken | longest stall | new connections failed | longest new-connection gap | UDP lost |\n|---|---|---|---|---|---|---|\n", d.backend)
	for _, r := range d.rows {
		event := r.event
		if r.stalls != "" {
			event += " (stalls: " + r.stalls + ")"
		}
		fmt.Fprintf(&b, "| %s | %d | %d | %s | %d | %s | %d of %d |\n", event, r.sum.Pairs, r.sum.Broken, r.sum.Stall.Round(time.Millisecond),
			r.sum.NewFail, r.sum.NewGap.Round(time.Millisecond), r.sum.UDPLost, r.sum.UDPTotal)
	}
	t.Log(b.String())
	for _, r := range d.rows {
		switch {
		case r.sum.Pairs == 0:
			t.Errorf("%s: no window recorded", r.event)
		case r.control && r.sum.Broken == 0:
			t.Errorf("%s: no held connection broke: the harness cannot see a broken data plane", r.event)
		case !r.control && r.stalls == "" && r.sum.Broken > 0:
			t.Errorf("%s: %d held connections broke: %v", r.event, r.sum.Broken, r.sum.Errors)
		}
	}
}

// restartDaemon stops node i's twilld (SIGTERM, or SIGKILL) and starts it
// again, until it is ready.
func restartDaemon(t *testing.T, c *cluster, i int, kill bool) {
	t.Helper()
	if kill {
		_ = c.daemons[i].cmd.Process.Signal(syscall.SIGKILL)
		waitFor(t, 10*time.Second, "twilld gone after SIGKILL", func() bool { gone, _ := c.daemons[i].Exited(); return gone })
	} else {
		c.daemons[i].Stop(t)
	}
	c.startDaemon(i)
	waitFor(t, 20*time.Second, "ready after the restart", func() bool { return strings.Contains(c.daemons[i].OwnOutput(), "msg=ready") })
}

// restartEtcd stops etcd (SIGTERM) and starts it again on the same data,
// until it serves.
func restartEtcd(t *testing.T, c *cluster) {
	t.Helper()
	c.etcd.Stop(t)
	c.etcd = c.etcdRun()
	cli := newEtcdClient(t, c)
	waitFor(t, 20*time.Second, "etcd serving again", func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_, err := cli.Get(ctx, "/twill.io/network/config")
		return err == nil
	})
}

// blackhole makes node 1 forward nothing for 1.5 s: a table of its own,
// dropping in the forward hook, then removed.
func blackhole(t *testing.T, c *cluster) {
	t.Helper()
	node := c.topo.Nodes[0].NS
	for _, args := range [][]string{{"add", "table", "inet", "hold-control"},
		{"add", "chain", "inet", "hold-control", "dropall", "{ type filter hook forward priority -300 ; policy drop ; }"}} {
		if out, err := execIn(node, append([]string{"nft"}, args...)...); err != nil {
			t.Fatalf("nft %v: %v\n%s", args, err, out)
		}
	}
	time.Sleep(1500 * time.Millisecond)
	if out, err := execIn(node, "nft", "delete", "table", "inet", "hold-control"); err != nil {
		t.Fatalf("nft delete table: %v\n%s", err, out)
	}
}

// rotateKey rotates node 1's WireGuard key (SIGUSR1) and waits until node
// 2 uses the new one.
func rotateKey(t *testing.T, c *cluster) {
	t.Helper()
	old := c.publishedKey(0)
	if err := c.daemons[0].cmd.Process.Signal(syscall.SIGUSR1); err != nil {
		t.Fatal(err)
	}
	var k string
	published := waitFor(t, 10*time.Second, "node1 publishing a new key", func() bool {
		k = c.publishedKey(0)
		return k != old
	})
	used := waitFor(t, 10*time.Second, "node2 using node1's new key", func() bool {
		keys := c.wgPeerKeys(1)
		return keys[k] && !keys[old]
	})
	// When held connections stall, how long node2 took says whose part
	// it was (a stall of 15 s once came 3 s after an etcd restart).
	t.Logf("key rotation: node1 published its new key %s after SIGUSR1, node2's device held it %s after that",
		published.Round(time.Millisecond), used.Round(time.Millisecond))
}

// labEchoIn serves the lab's echo (TCP lines and UDP) in a pod namespace on
// lab.EchoPort until the test ends.
func labEchoIn(t *testing.T, podNS string) {
	t.Helper()
	var l net.Listener
	var pc net.PacketConn
	err := ns.WithNetNSPath("/var/run/netns/"+podNS, func(ns.NetNS) error {
		var err error
		if l, err = net.Listen("tcp", fmt.Sprintf(":%d", lab.EchoPort)); err != nil {
			return err
		}
		pc, err = net.ListenPacket("udp", fmt.Sprintf(":%d", lab.EchoPort))
		return err
	})
	if err != nil {
		t.Fatalf("echo in %s: %v", podNS, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	go func() { _ = lab.Echo(ctx, l, pc) }()
}

func reachesEcho(netns string, to netip.AddrPort) bool {
	h, err := ns.GetNS(netns)
	if err != nil {
		return false
	}
	defer h.Close()
	return echoOnce(h, to) == nil
}
