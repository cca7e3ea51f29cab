package e2e

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"

	twcluster "github.com/twill-net/twill/lab/cluster"
	"github.com/twill-net/twill/lab/topology"
)

// listenOnce accepts one TCP connection on addr:port inside a namespace,
// within 15 s, and sends the address it came from.
func listenOnce(nsName string, addr netip.Addr, port int) (<-chan netip.Addr, error) {
	var l *net.TCPListener
	err := ns.WithNetNSPath("/var/run/netns/"+nsName, func(ns.NetNS) error {
		ln, err := net.Listen("tcp", netip.AddrPortFrom(addr, uint16(port)).String())
		if err == nil {
			l = ln.(*net.TCPListener)
		}
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("listening on %s:%d in %s: %w", addr, port, nsName, err)
	}
	_ = l.SetDeadline(time.Now().Add(15 * time.Second))
	from := make(chan netip.Addr, 1)
	go func() {
		defer l.Close()
		conn, err := l.Accept()
		if err != nil {
			return
		}
		defer conn.Close()
		from <- conn.RemoteAddr().(*net.TCPAddr).AddrPort().Addr().Unmap()
	}()
	return from, nil
}

// sourceSeen connects from a namespace to addr:port and returns the source
// address the listener saw.
func sourceSeen(t *testing.T, fromNS, toNS string, addr netip.Addr, port int) netip.Addr {
	t.Helper()
	a, err := sourceSeenTry(fromNS, toNS, addr, port, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// sourceSeenTry is sourceSeen, its failure returned.
func sourceSeenTry(fromNS, toNS string, addr netip.Addr, port int, timeout time.Duration) (netip.Addr, error) {
	from, err := listenOnce(toNS, addr, port)
	if err != nil {
		return netip.Addr{}, err
	}
	err = ns.WithNetNSPath("/var/run/netns/"+fromNS, func(ns.NetNS) error {
		conn, err := net.DialTimeout("tcp", netip.AddrPortFrom(addr, uint16(port)).String(), timeout)
		if err != nil {
			return err
		}
		return conn.Close()
	})
	if err != nil {
		return netip.Addr{}, fmt.Errorf("TCP from %s to %s:%d: %w", fromNS, addr, port, err)
	}
	select {
	case a := <-from:
		return a, nil
	case <-time.After(5 * time.Second):
		return netip.Addr{}, fmt.Errorf("the listener in %s saw no connection", toNS)
	}
}

// nodeRules is what a node holds of twill's rules in each mode.
func nodeRules(t *testing.T, nodeNS string) (iptables, nft string) {
	t.Helper()
	ipt, err := topology.Exec(nodeNS, "sh", "-c", "iptables-save; ip6tables-save")
	if err != nil {
		t.Fatal(err)
	}
	n, err := topology.Exec(nodeNS, "nft", "list", "table", "inet", "twill")
	if err != nil {
		n = "" // no such table
	}
	return ipt, n
}

// TestNetfilterModes runs a routed vxlan cluster with --ip-masq in each
// netfilter mode: a pod reaching a host outside the cluster Network (the
// router between the segments, which has no route to pods) arrives with
// its node's address, pod to pod keeps the pod's address, the rules read
// back from the kernel are the mode's alone, twillctl status reports a
// rule deleted by hand, and twilld cleanup removes them all.
func TestNetfilterModes(t *testing.T) {
	beside(t)
	for _, mode := range []string{"iptables", "nftables"} {
		t.Run(mode, func(t *testing.T) {
			c := newClusterWith(t, topology.Options{Nodes: 2, Underlay: netip.MustParsePrefix("10.99.0.0/24"), Routed: true})
			c.put("/twill.io/network/config", netConfVXLAN)
			for i := range 2 {
				c.startDaemon(i, "--ip-masq", "--netfilter", mode)
			}
			env := c.env(0)
			if env.Netfilter != mode {
				t.Fatalf("subnet.env says TWILL_NETFILTER=%q, want %s", env.Netfilter, mode)
			}
			peer := c.env(1).Subnet
			waitFor(t, 10*time.Second, "the route to node2's pods", func() bool { return strings.Contains(c.routes(0), peer.String()) })
			p1, ip1 := c.addPod(0, "p1")
			p2, ip2 := c.addPod(1, "p2")
			node1 := c.topo.Nodes[0].Addr.Addr()

			outside := netip.MustParseAddr("10.99.0.253") // the router, on node1's segment
			if got := sourceSeen(t, p1, c.topo.Router, outside, 8080); got != node1 {
				t.Errorf("pod %s → outside host %s arrived from %s, want node1's %s (masqueraded)", ip1, outside, got, node1)
			}
			if got := sourceSeen(t, p1, p2, ip2, 8081); got != ip1 {
				t.Errorf("pod %s → pod %s arrived from %s, want the pod's own address", ip1, ip2, got)
			}

			ipt, nft := nodeRules(t, c.topo.Nodes[0].NS)
			switch mode {
			case "iptables":
				if !contains(ipt, "-A TWILL-POSTRTG", "MASQUERADE --random-fully", "-A TWILL-FWD") || nft != "" {
					t.Errorf("iptables mode: rules\n%s\nnftables table inet twill:\n%s", ipt, nft)
				}
			case "nftables":
				if strings.Contains(ipt, "TWILL") || !contains(nft, "masquerade fully-random", `comment "twill: from pods (ipv4)"`) {
					t.Errorf("nftables mode: iptables\n%s\nnftables table inet twill:\n%s", ipt, nft)
				}
			}

			// status, with the daemon stopped so it cannot repair first.
			ns0 := c.topo.Nodes[0].NS
			status := func() (string, error) {
				out, err := exec.Command("ip", "netns", "exec", ns0, c.bin+"/twillctl", "status", "--etcd-endpoints", c.etcdURL,
					"--subnet-file", c.subnetFile(0), "--iface", "eth0").CombinedOutput()
				return string(out), err
			}
			if out, err := status(); err != nil || !strings.Contains(out, "netfilter  in sync ("+mode+")") {
				t.Errorf("status with the rules in place: %v\n%s", err, out)
			}
			c.daemons[0].Stop(t)
			breakIt := map[string][]string{
				"iptables": {"iptables", "-t", "nat", "-D", "TWILL-POSTRTG", "2"},
				"nftables": {"nft", "flush", "chain", "inet", "twill", "postrouting"},
			}[mode]
			if out, err := topology.Exec(ns0, breakIt[0], breakIt[1:]...); err != nil {
				t.Fatalf("%v: %s", err, out)
			}
			if out, err := status(); err == nil || !contains(out, "netfilter  DRIFT ("+mode+")", "missing", "pod to outside") {
				t.Errorf("status after `%s`: %v, want exit 1 and the missing rule\n%s", strings.Join(breakIt, " "), err, out)
			}
			if out, err := topology.Exec(ns0, c.bin+"/twilld", "cleanup", "--subnet-file", c.subnetFile(0),
				"--state-dir", filepath.Dir(c.subnetFile(0))); err != nil {
				t.Fatalf("cleanup: %v\n%s", err, out)
			}
			if ipt, nft := nodeRules(t, ns0); strings.Contains(ipt, "TWILL") || nft != "" {
				t.Errorf("rules left after cleanup:\n%s\n%s", ipt, nft)
			}
		})
	}
}

// TestNetfilterSwitch: restarting twilld in the other mode removes the
// first mode's rules, both ways.
func TestNetfilterSwitch(t *testing.T) {
	beside(t)
	c := newCluster(t, 1)
	c.put("/twill.io/network/config", netConfHostGW)
	ns0 := c.topo.Nodes[0].NS
	for i, mode := range []string{"iptables", "nftables", "iptables"} {
		c.startDaemon(0, "--ip-masq", "--netfilter", mode)
		waitFor(t, 10*time.Second, fmt.Sprintf("start %d: the %s rules alone", i+1, mode), func() bool {
			ipt, nft := nodeRules(t, ns0)
			if mode == "iptables" {
				return strings.Contains(ipt, "-A TWILL-FWD") && nft == ""
			}
			return !strings.Contains(ipt, "TWILL") && strings.Contains(nft, "chain forward")
		})
		c.daemons[0].Stop(t)
	}
}

// TestNetfilterSwitchFails: a twilld whose new mode cannot be installed
// (the iptables mode on a node without iptables binaries) exits saying
// why, and leaves the old mode's rules in place: pods keep masquerading.
func TestNetfilterSwitchFails(t *testing.T) {
	beside(t)
	c := newCluster(t, 1)
	c.put("/twill.io/network/config", netConfHostGW)
	n := c.topo.Nodes[0]
	c.startDaemon(0, "--ip-masq", "--netfilter", "nftables")
	waitFor(t, 10*time.Second, "the nftables rules", func() bool { _, nft := nodeRules(t, n.NS); return nft != "" })
	c.daemons[0].Stop(t)

	state := twcluster.NodeDir(c.dir, n.Name)
	d := startEnv(t, []string{"PATH=" + t.TempDir()}, n.NS, filepath.Join(c.dir, "no-iptables.log"), c.bin+"/twilld",
		twcluster.DaemonArgs(c.etcdURL, state, "--ip-masq", "--netfilter", "iptables")...)
	waitFor(t, 20*time.Second, "twilld to give up on the iptables mode", func() bool { done, _ := d.Exited(); return done })
	if !strings.Contains(d.Output(), "installing the iptables rules") {
		t.Errorf("twilld without iptables binaries, in the iptables mode:\n%s", d.Output())
	}
	if _, nft := nodeRules(t, n.NS); !strings.Contains(nft, "masquerade fully-random") {
		t.Errorf("the failed switch removed the nftables rules; the node has none left:\n%s", d.Output())
	}
}

// TestNetfilterAuto: on this machine (iptables-nft, nothing dropping
// forwarded traffic) auto picks nftables and says why; with twill's
// iptables chains left by an earlier run it keeps iptables.
func TestNetfilterAuto(t *testing.T) {
	beside(t)
	if !strings.Contains(mustOut(t, "iptables", "--version"), "nf_tables") {
		t.Fatal("this test expects iptables-nft on the machine")
	}
	c := newCluster(t, 1)
	c.put("/twill.io/network/config", netConfHostGW)
	d := c.startDaemon(0)
	waitFor(t, 10*time.Second, "auto to choose", func() bool { return strings.Contains(d.Output(), "netfilter mode") })
	if !contains(d.Output(), "mode=nftables", "iptables-nft, no twill iptables chains") {
		t.Errorf("auto on a clean iptables-nft node:\n%s", d.Output())
	}
	d.Stop(t)
	ns0 := c.topo.Nodes[0].NS
	if out, err := topology.Exec(ns0, "iptables", "-t", "filter", "-N", "TWILL-FWD"); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	d = c.startDaemon(0) // its log follows the first daemon's
	waitFor(t, 10*time.Second, "auto to choose again", func() bool { return strings.Count(d.Output(), "netfilter mode") == 2 })
	out := d.Output()
	if second := out[strings.LastIndex(out, "netfilter mode"):]; !contains(second, "mode=iptables", "chains exist from an earlier run") {
		t.Errorf("auto with twill's iptables chains present:\n%s", out)
	}
}

func mustOut(t *testing.T, name string, args ...string) string {
	t.Helper()
	out, err := exec.CommandContext(context.Background(), name, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s: %v: %s", name, err, out)
	}
	return string(out)
}

// traceExecs runs strace on pid and its threads and children until stop
// returns, and gives back the execve calls it saw. It fails the test if
// strace did not attach.
func traceExecs(t *testing.T, pid int, stop func()) []string {
	t.Helper()
	out := filepath.Join(t.TempDir(), "strace.out")
	errPath := out + ".stderr"
	errFile, err := os.Create(errPath)
	if err != nil {
		t.Fatal(err)
	}
	defer errFile.Close()
	stderr := func() string { b, _ := os.ReadFile(errPath); return string(b) }
	cmd := exec.Command("strace", "-f", "-e", "trace=execve", "-o", out, "-p", strconv.Itoa(pid))
	cmd.Stderr = errFile
	if err := cmd.Start(); err != nil {
		t.Fatalf("strace: %v", err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	waitFor(t, 10*time.Second, "strace to attach", func() bool { return strings.Contains(stderr(), "attached") })
	stop()
	_ = cmd.Process.Signal(syscall.SIGINT) // strace detaches and exits
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		// strace can hang detaching from a tracee caught mid-fork. Killing
		// it detaches every tracee (the kernel does), and what it traced
		// until then is already in its output file.
		_ = cmd.Process.Kill()
		<-done
		t.Logf("strace did not exit on SIGINT within 10s; killed it. Its stderr:\n%s", stderr())
	}
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	var execs []string
	for _, l := range strings.Split(string(b), "\n") {
		if strings.Contains(l, "execve(") {
			execs = append(execs, l)
		}
	}
	return execs
}

// TestNFTablesIdleNoExec: an idle twilld, with 1,000 peers, execs nothing
// for 60 s, in the nftables mode and in the iptables mode (iptables-nft,
// its safety check every 2 s: it checks only if nftables' generation
// moved). The same trace of the iptables mode's twilld whose chain is
// flushed sees its iptables execs, so the method does see execs. It runs beside the other tests that bound no
// time: most of it is a minute of watching an idle daemon.
func TestNFTablesIdleNoExec(t *testing.T) {
	beside(t)
	c := newClusterOn(t, 2, netip.MustParsePrefix("192.168.0.0/16"))
	c.put("/twill.io/network/config", fmt.Sprintf(`{"Network":%q,"Backend":{"Type":"host-gw"}}`, benchNetwork))
	putLeases(t, c, "host-gw", 1000)
	routes := watchRoutes(t, c.topo.Nodes[0].NS)
	nft := c.startDaemon(0, "--ip-masq", "--netfilter", "nftables")
	// The iptables mode's safety check every 2 s, not 5 min: idle, it
	// must not exec iptables for it either.
	ipt := c.startDaemon(1, "--ip-masq", "--netfilter", "iptables", "--resync", "2s", "--resync-watched", "2s")
	if err := routes.waitCount(1000, 60*time.Second); err != nil {
		t.Fatal(err)
	}
	c.env(0)
	c.env(1)

	ns1 := c.topo.Nodes[1].NS
	control := traceExecs(t, ipt.cmd.Process.Pid, func() {
		if out, err := topology.Exec(ns1, "iptables", "-t", "filter", "-F", "TWILL-FWD"); err != nil {
			t.Fatalf("%v: %s", err, out)
		}
		waitFor(t, 20*time.Second, "the iptables mode to repair its chain", func() bool {
			s, _ := topology.Exec(ns1, "iptables-save", "-t", "filter")
			return strings.Contains(s, "-A TWILL-FWD")
		})
		time.Sleep(2 * time.Second) // the repair's last execs end before strace detaches
	})
	if len(control) == 0 {
		t.Fatal("the trace saw no exec from the iptables mode repairing its chain: the method cannot see execs")
	}
	t.Logf("control: the iptables mode's repair made %d execs, e.g. %s", len(control), control[0])

	time.Sleep(2 * time.Second) // the start-up's last events settle
	var iptExecs []string
	execs := traceExecs(t, nft.cmd.Process.Pid, func() {
		iptExecs = traceExecs(t, ipt.cmd.Process.Pid, func() { time.Sleep(60 * time.Second) })
	})
	if len(execs) > 0 {
		t.Errorf("an idle twilld in the nftables mode made %d execs in 60 s:\n%s", len(execs), strings.Join(execs, "\n"))
	}
	if len(iptExecs) > 0 {
		t.Errorf("an idle twilld in the iptables mode (iptables-nft, a safety check every 2 s) made %d execs in 60 s:\n%s", len(iptExecs), strings.Join(iptExecs, "\n"))
	}
}
