package plugin_test

import (
	"encoding/json"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/cni/pkg/types"
	cnins "github.com/containernetworking/plugins/pkg/ns"

	"github.com/twill-net/twill/lab/cnidriver"
	"github.com/twill-net/twill/testsupport/netnstest"
)

// hostPortCap is the twill plugin declaring portMappings, as the shipped
// conflist does.
const hostPortCap = `,"capabilities":{"portMappings":true}`

// capConflist is n's network list with the twill plugin declaring
// portMappings.
func (n *node) capConflist() json.RawMessage {
	return json.RawMessage(fmt.Sprintf(`{"cniVersion":"1.1.0","name":"twillnet","plugins":[{"type":"twill","subnetFile":%q,"dataDir":%q%s}]}`,
		n.subnetFile, n.dataDir, hostPortCap))
}

// withPorts gives a pod the runtime's port mappings.
func withPorts(a cnidriver.Attachment, mappings ...string) cnidriver.Attachment {
	var pm []any
	for _, m := range mappings {
		var v any
		if err := json.Unmarshal([]byte(m), &v); err != nil {
			panic(err)
		}
		pm = append(pm, v)
	}
	a.CapabilityArgs = map[string]any{"portMappings": pm}
	return a
}

// client is a namespace outside the node, on 192.168.60.0/24 with the
// node at .1.
func (n *node) client() string {
	c := netnstest.New(n.t, "cli")
	netnstest.Veth(n.t, n.ns, "up1", c, "eth0")
	netnstest.IP(n.t, n.ns, "addr", "add", "192.168.60.1/24", "dev", "up1")
	netnstest.IP(n.t, c, "addr", "add", "192.168.60.2/24", "dev", "eth0")
	netnstest.IP(n.t, c, "route", "add", "default", "via", "192.168.60.1")
	return c
}

// echo runs the lab's echo server in a pod's namespace until the test ends.
func (n *node) echo(ns string, port int) {
	n.t.Helper()
	ready := filepath.Join(n.t.TempDir(), "ready")
	c := exec.Command("ip", "netns", "exec", ns, n.bin+"/twill-lab", "lab", "echo-server", "--port", fmt.Sprint(port), "--ready-file", ready)
	if err := c.Start(); err != nil {
		n.t.Fatal(err)
	}
	n.t.Cleanup(func() { _ = c.Process.Kill(); _ = c.Wait() })
	for i := 0; i < 100; i++ {
		if _, err := os.Stat(ready); err == nil {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	n.t.Fatalf("echo server in %s not listening after 5 s", ns)
}

// probe is the lab's probe of target from ns: "" when it echoed.
func (n *node) probe(ns, target string) string {
	n.t.Helper()
	out, err := exec.Command("ip", "netns", "exec", ns, n.bin+"/twill-lab", "lab", "probe", target).CombinedOutput()
	if err != nil {
		n.t.Fatalf("probe %s from %s: %v: %s", target, ns, err, out)
	}
	var res map[string]string
	if err := json.Unmarshal(out, &res); err != nil {
		n.t.Fatalf("probe output %s: %v", out, err)
	}
	return res[target]
}

// A pod's hostPort answers from outside the node, from the node itself,
// from another pod and from the pod itself (hairpin), with no plugin
// chained after twill; DEL takes it away again, and leaves the other
// pod's.
func TestPrivilegedHostPorts(t *testing.T) {
	n := newNode(t, "10.244.7.0/24")
	list := n.capConflist()
	web := withPorts(n.pod("web"), `{"hostPort":8080,"containerPort":80,"protocol":"tcp"}`)
	other := withPorts(n.pod("other"), `{"hostPort":8081,"containerPort":80,"protocol":"tcp","hostIP":"192.168.60.1"}`)
	mustOK(t, "ADD", n.run(cnidriver.Request{Op: "add", ConfList: list, Attachments: []cnidriver.Attachment{web, other}}))
	mustOK(t, "CHECK", n.run(cnidriver.Request{Op: "check", ConfList: list, Attachments: []cnidriver.Attachment{web, other}}))
	cli := n.client()
	n.echo(nsName(web.Netns), 80)
	n.echo(nsName(other.Netns), 80)
	for _, p := range []struct{ from, target string }{
		{cli, "192.168.60.1:8080"},
		{cli, "192.168.60.1:8081"},
		{n.ns, "192.168.50.1:8080"},
		{nsName(other.Netns), "192.168.50.1:8080"},
		{nsName(web.Netns), "192.168.50.1:8080"}, // hairpin
	} {
		if e := n.probe(p.from, p.target); e != "" {
			t.Errorf("%s from %s: %s", p.target, p.from, e)
		}
	}
	if e := n.probe(cli, "192.168.50.1:8081"); e == "" {
		t.Error("8081 answered on 192.168.50.1; its mapping names 192.168.60.1 alone")
	}
	mustOK(t, "DEL", n.run(cnidriver.Request{Op: "del", ConfList: list, Attachments: []cnidriver.Attachment{web}}))
	table, _ := netnstest.Exec(n.ns, "nft", "list", "table", "inet", "twill-hostport")
	if strings.Contains(table, ":8080") || !strings.Contains(table, "192.168.60.1:8081") {
		t.Errorf("after web's DEL the table holds:\n%s\nwant other's mapping alone", table)
	}
	if e := n.probe(cli, "192.168.60.1:8081"); e != "" {
		t.Errorf("other's host port after web's DEL: %s", e)
	}
	mustOK(t, "DEL", n.run(cnidriver.Request{Op: "del", ConfList: list, Attachments: []cnidriver.Attachment{other}}))
	n.requireClean()
}

// A hostPort bound to 127.0.0.1 answers on 127.0.0.1 from the node (as
// portmap serves it, and Kubernetes' HostPort conformance spec asks), from
// a loopback source too; one bound to no address is not served there, and
// the loopback-bound one is not served on the node's other addresses.
func TestPrivilegedHostPortOnLoopback(t *testing.T) {
	n := newNode(t, "10.244.7.0/24")
	list := n.capConflist()
	lo := withPorts(n.pod("lo"), `{"hostPort":8090,"containerPort":80,"protocol":"tcp","hostIP":"127.0.0.1"}`)
	wild := withPorts(n.pod("wild"), `{"hostPort":8091,"containerPort":80,"protocol":"tcp"}`)
	mustOK(t, "ADD", n.run(cnidriver.Request{Op: "add", ConfList: list, Attachments: []cnidriver.Attachment{lo, wild}}))
	mustOK(t, "CHECK", n.run(cnidriver.Request{Op: "check", ConfList: list, Attachments: []cnidriver.Attachment{lo, wild}}))
	n.echo(nsName(lo.Netns), 80)
	n.echo(nsName(wild.Netns), 80)
	if e := n.probe(n.ns, "127.0.0.1:8090"); e != "" {
		t.Errorf("127.0.0.1:8090 from the node: %s", e)
	}
	if e := n.probe(n.ns, "192.168.50.1:8091"); e != "" {
		t.Errorf("192.168.50.1:8091 from the node: %s", e)
	}
	for _, target := range []string{"127.0.0.1:8091", "192.168.50.1:8090"} {
		if e := n.probe(n.ns, target); e == "" {
			t.Errorf("%s answered from the node: it has no mapping there", target)
		}
	}
	mustOK(t, "DEL", n.run(cnidriver.Request{Op: "del", ConfList: list, Attachments: []cnidriver.Attachment{lo, wild}}))
	n.requireClean()
}

// ruleset is the node's whole nftables ruleset (iptables-nft's rules too).
func (n *node) ruleset() string {
	n.t.Helper()
	out, err := netnstest.Exec(n.ns, "nft", "list", "ruleset")
	if err != nil {
		n.t.Fatalf("nft list ruleset: %v: %s", err, out)
	}
	return out
}

// A pod that portmap, chained after twill, wired before the conflist
// served the capability itself: its DEL under the new conflist has
// portmap remove portmap's rules. GC removes host ports whose pod the
// runtime no longer has.
func TestPrivilegedHostPortsMigrateFromPortmapAndGC(t *testing.T) {
	n := newNode(t, "10.244.7.0/24")
	old := n.conflist("1.1.0", `{"type":"portmap","capabilities":{"portMappings":true}}`)
	legacy := withPorts(n.pod("legacy-pod"), `{"hostPort":9090,"containerPort":80,"protocol":"tcp"}`)
	mustOK(t, "ADD (portmap chained)", n.run(cnidriver.Request{Op: "add", ConfList: old, Attachments: []cnidriver.Attachment{legacy}}))
	if !strings.Contains(n.ruleset(), "dport 9090") {
		t.Fatalf("portmap wrote no rule for port 9090:\n%s", n.ruleset())
	}
	list := n.capConflist()
	mustOK(t, "DEL (twill serving host ports)", n.run(cnidriver.Request{Op: "del", ConfList: list, Attachments: []cnidriver.Attachment{legacy}}))
	if rs := n.ruleset(); strings.Contains(rs, "9090") {
		t.Errorf("portmap's rules stayed after DEL:\n%s", rs)
	}
	gone := withPorts(n.pod("gone"), `{"hostPort":8080,"containerPort":80,"protocol":"tcp"}`)
	kept := withPorts(n.pod("kept"), `{"hostPort":8081,"containerPort":80,"protocol":"tcp"}`)
	mustOK(t, "ADD", n.run(cnidriver.Request{Op: "add", ConfList: list, Attachments: []cnidriver.Attachment{gone, kept}}))
	// libcni's GC sends DEL for the attachments it cached; without its
	// cache, GC alone must find the pod the runtime no longer has.
	if err := os.RemoveAll(filepath.Join(n.dir, "cache")); err != nil {
		t.Fatal(err)
	}
	mustOK(t, "GC", n.run(cnidriver.Request{Op: "gc", ConfList: list, Valid: []types.GCAttachment{{ContainerID: "kept", IfName: "eth0"}}}))
	if rs := n.ruleset(); strings.Contains(rs, ":8080") || !strings.Contains(rs, ":8081") {
		t.Errorf("after GC the ruleset holds:\n%s\nwant kept's host port alone", rs)
	}
	mustOK(t, "DEL", n.run(cnidriver.Request{Op: "del", ConfList: list, Attachments: []cnidriver.Attachment{kept}}))
	n.requireClean()
}

// udpIn opens a UDP socket inside the namespace ns.
func udpIn(t *testing.T, ns string) *net.UDPConn {
	t.Helper()
	target, err := cnins.GetNS("/var/run/netns/" + ns)
	if err != nil {
		t.Fatal(err)
	}
	defer target.Close()
	var c *net.UDPConn
	err = target.Do(func(cnins.NetNS) error {
		c, err = net.ListenUDP("udp4", &net.UDPAddr{Port: 40000})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// echoed sends msg to dst and says whether it came back within a second.
func echoed(c *net.UDPConn, dst string, msg string) bool {
	if _, err := c.WriteToUDPAddrPort([]byte(msg), netip.MustParseAddrPort(dst)); err != nil {
		return false
	}
	_ = c.SetReadDeadline(time.Now().Add(time.Second))
	buf := make([]byte, 64)
	n, _, err := c.ReadFromUDPAddrPort(buf)
	return err == nil && string(buf[:n]) == msg
}

// A client that keeps one UDP flow to a host port reaches the pod that
// took the port over, not the one deleted before it: the flow's conntrack
// entry, which still points at the old pod, is forgotten at ADD.
func TestPrivilegedUDPHostPortFollowsItsNewPod(t *testing.T) {
	n := newNode(t, "10.244.7.0/24")
	list := n.capConflist()
	const dns = `{"hostPort":5300,"containerPort":5300,"protocol":"udp"}`
	first := withPorts(n.pod("first"), dns)
	mustOK(t, "ADD", n.run(cnidriver.Request{Op: "add", ConfList: list, Attachments: []cnidriver.Attachment{first}}))
	n.echo(nsName(first.Netns), 5300)
	cli := n.client()
	c := udpIn(t, cli)
	if !echoed(c, "192.168.60.1:5300", "to the first") {
		t.Fatal("the first pod's UDP host port did not answer")
	}
	mustOK(t, "DEL", n.run(cnidriver.Request{Op: "del", ConfList: list, Attachments: []cnidriver.Attachment{first}}))
	second := withPorts(n.pod("second"), dns)
	mustOK(t, "ADD", n.run(cnidriver.Request{Op: "add", ConfList: list, Attachments: []cnidriver.Attachment{second}}))
	n.echo(nsName(second.Netns), 5300)
	if !echoed(c, "192.168.60.1:5300", "to the second") {
		t.Error("the same UDP flow did not reach the pod that took the host port over")
	}
	mustOK(t, "DEL", n.run(cnidriver.Request{Op: "del", ConfList: list, Attachments: []cnidriver.Attachment{second}}))
}

// A port mapping the plugin refuses fails ADD, naming the entry and the
// field, before anything is made; the DEL the runtime sends after it
// succeeds (a DEL that failed would keep the sandbox from going).
func TestPrivilegedBadPortMappingFailsAddNotDel(t *testing.T) {
	n := newNode(t, "10.244.7.0/24")
	list := n.capConflist()
	bad := withPorts(n.pod("bad"), `{"hostPort":8080,"containerPort":80,"protocol":"icmp"}`)
	resp := n.run(cnidriver.Request{Op: "add", ConfList: list, Attachments: []cnidriver.Attachment{bad}})
	if e := resp.Outcomes[0].Error; !strings.Contains(e, `runtimeConfig.portMappings[0].protocol "icmp": must be tcp, udp or sctp`) {
		t.Fatalf("ADD with a bad mapping: %q, want the entry and field named", e)
	}
	n.requireClean()
	mustOK(t, "DEL", n.run(cnidriver.Request{Op: "del", ConfList: list, Attachments: []cnidriver.Attachment{bad}}))
}
