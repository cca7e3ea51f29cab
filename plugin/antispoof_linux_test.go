package plugin_test

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	current "github.com/containernetworking/cni/pkg/types/100"

	"github.com/twill-net/twill/lab/cnidriver"
	"github.com/twill-net/twill/plugin"
	"github.com/twill-net/twill/subnet"
	"github.com/twill-net/twill/testsupport/forge"
	"github.com/twill-net/twill/testsupport/netnstest"
)

// podAddrs are an ADD result's addresses, by family.
func podAddrs(t testing.TB, o cnidriver.Outcome) (v4, v6 netip.Addr) {
	t.Helper()
	var r current.Result
	if err := json.Unmarshal(o.Result, &r); err != nil {
		t.Fatalf("ADD result %s: %v", o.Result, err)
	}
	for _, ip := range r.IPs {
		a, _ := netip.AddrFromSlice(ip.Address.IP)
		if a = a.Unmap(); a.Is4() {
			v4 = a
		} else {
			v6 = a
		}
	}
	if !v4.IsValid() || !v6.IsValid() {
		t.Fatalf("ADD result %s: want an address of each family", o.Result)
	}
	return v4, v6
}

// A pod that forges its source address with a raw socket (CAP_NET_RAW,
// which container runtimes grant by default) gets none of its forged
// datagrams to another pod, posing as a third pod of the node or as an
// address from outside the cluster, over IPv4 and IPv6; the same socket's
// datagrams from the pod's own address arrive, and so do the posed-as
// pod's own. The kernel counts the drops in the check's rule, and DEL
// takes the pod out of the check.
func TestPrivilegedForgedSourcesAreDropped(t *testing.T) {
	n := newNode(t, "")
	if err := subnet.WriteEnv(n.subnetFile, subnet.Env{Network: netip.MustParsePrefix("10.244.0.0/16"), Subnet: netip.MustParsePrefix("10.244.7.0/24"),
		IPv6Network: netip.MustParsePrefix("fd10::/56"), IPv6Subnet: netip.MustParsePrefix("fd10:0:0:7::/64"), MTU: 1450, Backend: "host-gw"}); err != nil {
		t.Fatal(err)
	}
	if out, err := netnstest.Exec(n.ns, "sh", "-c", "echo 1 > /proc/sys/net/ipv6/conf/all/forwarding"); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	list := n.conflist("1.1.0")
	server, allowed, attacker := n.pod("server"), n.pod("allowed"), n.pod("attacker")
	resp := n.run(cnidriver.Request{Op: "add", ConfList: list, Attachments: []cnidriver.Attachment{server, allowed, attacker}})
	mustOK(t, "ADD", resp)
	mustOK(t, "CHECK", n.run(cnidriver.Request{Op: "check", ConfList: list, Attachments: []cnidriver.Attachment{server, allowed, attacker}}))
	srv4, srv6 := podAddrs(t, resp.Outcomes[0])
	ok4, ok6 := podAddrs(t, resp.Outcomes[1])
	bad4, bad6 := podAddrs(t, resp.Outcomes[2])
	const port = 8081
	got, err := forge.Listen(server.Netns, port)
	if err != nil {
		t.Fatal(err)
	}
	defer got.Close()
	// Let IPv6 duplicate address detection end on every veth.
	time.Sleep(2 * time.Second)
	const each = 50
	type send struct {
		from     string
		src, dst netip.Addr
		forged   bool
	}
	var sends []send
	for _, f := range []struct{ srv, ok, bad, outside netip.Addr }{
		{srv4, ok4, bad4, netip.MustParseAddr("203.0.113.9")},
		{srv6, ok6, bad6, netip.MustParseAddr("2001:db8::9")},
	} {
		sends = append(sends,
			send{attacker.Netns, f.ok, f.srv, true},      // as another pod of the node
			send{attacker.Netns, f.outside, f.srv, true}, // as an address from elsewhere
			send{attacker.Netns, f.bad, f.srv, false},    // the attacker's own address: the control
			send{allowed.Netns, f.ok, f.srv, false},      // the posed-as pod's own
		)
	}
	for i, s := range sends {
		// The attacker's sends go first: the posed-as pod's own come
		// after, so that what arrives from its address before them is
		// forged.
		if _, err := forge.UDP(s.from, netip.AddrPortFrom(s.src, uint16(40000+i)), netip.AddrPortFrom(s.dst, port), []byte("forged?"), each); err != nil {
			t.Fatal(err)
		}
		time.Sleep(200 * time.Millisecond)
		arrived := got.Count(s.src)
		switch {
		case s.forged && arrived != 0:
			t.Errorf("%d of %d datagrams forged from %s (by the attacker pod) reached the server pod", arrived, each, s.src)
		case !s.forged && arrived < each*9/10:
			t.Errorf("only %d of %d datagrams from %s's own address reached the server pod: the check drops what it must not", arrived, each, s.src)
		}
	}
	ruleset, _ := netnstest.Exec(n.ns, "nft", "list", "table", "inet", "twill-antispoof")
	if !strings.Contains(ruleset, fmt.Sprintf("counter packets %d ", 4*each)) {
		t.Errorf("the check's counter, want %d packets dropped:\n%s", 4*each, ruleset)
	}
	// A veth that is not in the set (its pod wired before the check
	// existed; here its element deleted by hand) is back under the check
	// from the node's next ADD on.
	veth := plugin.HostVethName("attacker", "eth0")
	if out, err := netnstest.Exec(n.ns, "nft", "delete", "element", "inet", "twill-antispoof", "pods", "{ "+veth+" }"); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	forged := netip.AddrPortFrom(ok4, 41000)
	before := got.Count(ok4)
	if _, err := forge.UDP(attacker.Netns, forged, netip.AddrPortFrom(srv4, port), []byte("forged?"), each); err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond)
	if got.Count(ok4) == before {
		t.Fatal("out of the set, the attacker's forged datagrams still did not arrive: the test cannot see the check")
	}
	late := n.pod("late")
	mustOK(t, "ADD", n.run(cnidriver.Request{Op: "add", ConfList: list, Attachments: []cnidriver.Attachment{late}}))
	before = got.Count(ok4)
	if _, err := forge.UDP(attacker.Netns, forged, netip.AddrPortFrom(srv4, port), []byte("forged?"), each); err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond)
	if n := got.Count(ok4) - before; n != 0 {
		t.Errorf("after another pod's ADD, %d of %d forged datagrams from the attacker's veth still arrived", n, each)
	}
	mustOK(t, "DEL", n.run(cnidriver.Request{Op: "del", ConfList: list, Attachments: []cnidriver.Attachment{server, allowed, attacker, late}}))
	n.requireClean()
}
