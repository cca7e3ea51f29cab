package plugin_test

import (
	"os/exec"
	"strings"
	"testing"

	"github.com/twill-net/twill/lab/cnidriver"
	"github.com/twill-net/twill/testsupport/netnstest"
)

// bridgePod makes what flannel's plugin leaves on a node switched from
// flannel: cni0 with the subnet's gateway, and a pod on it that sees the
// whole subnet as on-link.
func (n *node) bridgePod(ip string) cnidriver.Attachment {
	n.t.Helper()
	pod := netnstest.New(n.t, "brpod")
	for _, c := range [][]string{
		{"ip", "-n", n.ns, "link", "add", "cni0", "type", "bridge"},
		{"ip", "-n", n.ns, "addr", "add", "10.244.7.1/24", "dev", "cni0"},
		{"ip", "-n", n.ns, "link", "set", "cni0", "up"},
		{"ip", "-n", n.ns, "link", "add", "vethfl", "type", "veth", "peer", "name", "eth0", "netns", pod},
		{"ip", "-n", n.ns, "link", "set", "vethfl", "master", "cni0", "up"},
		{"ip", "-n", pod, "addr", "add", ip + "/24", "dev", "eth0"},
		{"ip", "-n", pod, "link", "set", "eth0", "up"},
		{"ip", "-n", pod, "route", "add", "default", "via", "10.244.7.1"},
	} {
		if out, err := exec.Command(c[0], c[1:]...).CombinedOutput(); err != nil {
			n.t.Fatalf("%s: %v: %s", strings.Join(c, " "), err, out)
		}
	}
	return cnidriver.Attachment{ContainerID: "flannel-pod", IfName: "eth0", Netns: "/var/run/netns/" + pod}
}

// TestPrivilegedBesideFlannelsBridge: a pod twill wires on a node switched
// from flannel and a pod still on flannel's bridge reach each other (the
// bridge answers ARP for twill's pod), and a DEL of the bridge pod through
// twill's plugin takes it off the bridge.
func TestPrivilegedBesideFlannelsBridge(t *testing.T) {
	n := newNode(t, "10.244.7.0/24")
	br := n.bridgePod("10.244.7.200")
	list := n.conflist("1.0.0")
	resp := n.run(cnidriver.Request{Op: "add", ConfList: list, Attachments: []cnidriver.Attachment{n.pod("tw-pod")}})
	mustOK(t, "ADD", resp)
	ip := podIP(t, resp.Outcomes[0])
	if out, _ := netnstest.Exec(n.ns, "cat", "/proc/sys/net/ipv4/conf/cni0/proxy_arp"); strings.TrimSpace(out) != "1" {
		t.Errorf("proxy_arp on cni0 is %q after ADD, want 1", out)
	}
	if err := pingFrom(nsName(br.Netns), ip); err != nil {
		t.Errorf("the pod on flannel's bridge cannot reach twill's pod: %v", err)
	}
	mustOK(t, "DEL", n.run(cnidriver.Request{Op: "del", ConfList: list, Attachments: []cnidriver.Attachment{br}}))
	if out, err := exec.Command("ip", "-n", n.ns, "link", "show", "master", "cni0").CombinedOutput(); err != nil || strings.TrimSpace(string(out)) != "" {
		t.Errorf("cni0 still has ports after the bridge pod's DEL: %s (%v)", out, err)
	}
}

// TestPrivilegedForeignCni0Untouched: a cni0 whose subnet does not hold
// the pod is not flannel's; ADD leaves its proxy ARP alone.
func TestPrivilegedForeignCni0Untouched(t *testing.T) {
	n := newNode(t, "10.244.7.0/24")
	for _, c := range [][]string{
		{"ip", "-n", n.ns, "link", "add", "cni0", "type", "bridge"},
		{"ip", "-n", n.ns, "addr", "add", "192.168.77.1/24", "dev", "cni0"},
	} {
		if out, err := exec.Command(c[0], c[1:]...).CombinedOutput(); err != nil {
			t.Fatalf("%s: %v: %s", strings.Join(c, " "), err, out)
		}
	}
	mustOK(t, "ADD", n.run(cnidriver.Request{Op: "add", ConfList: n.conflist("1.0.0"), Attachments: []cnidriver.Attachment{n.pod("tw-pod")}}))
	if out, _ := netnstest.Exec(n.ns, "cat", "/proc/sys/net/ipv4/conf/cni0/proxy_arp"); strings.TrimSpace(out) != "0" {
		t.Errorf("proxy_arp on someone else's cni0 is %q after ADD, want 0 (untouched)", out)
	}
}
