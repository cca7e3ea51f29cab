package plugin_test

import (
	"fmt"
	"net/netip"
	"os/exec"
	"strings"
	"testing"

	"github.com/twill-net/twill/lab/cnidriver"
	"github.com/twill-net/twill/subnet"
)

// writeENIEnv writes subnet.env as the eni backend's daemon does (prefix
// mode, table 100, rules 512 and 1536).
func (n *node) writeENIEnv(subnetCIDR string) {
	err := subnet.WriteEnv(n.subnetFile, subnet.Env{
		Network: netip.MustParsePrefix("10.244.0.0/16"), Subnet: netip.MustParsePrefix(subnetCIDR), MTU: 1500, Backend: "eni",
		Extra: map[string]string{"ENI_MODE": "prefix", "ENI_TABLE": "100", "ENI_RULE_TO_POD": "512", "ENI_RULE_FROM_POD": "1536", "ENI_INTERFACE": "eth0"},
	})
	if err != nil {
		n.t.Fatal(err)
	}
}

func (n *node) rules() string {
	out, err := exec.Command("ip", "-n", n.ns, "rule", "show").CombinedOutput()
	if err != nil {
		n.t.Fatalf("ip rule: %v: %s", err, out)
	}
	return string(out)
}

// TestPrivilegedENIRules: in eni mode ADD adds the pod's two rules, CHECK
// verifies them, and DEL removes them; a late DEL carrying a prevResult
// whose address now belongs to another pod leaves that pod's rules alone.
func TestPrivilegedENIRules(t *testing.T) {
	// A /30: one usable address, so the second pod gets the first's.
	n := newNode(t, "")
	n.writeENIEnv("10.244.7.0/30")
	list := n.conflist("1.1.0")
	a := n.pod("a")
	res := n.run(cnidriver.Request{Op: "add", ConfList: list, Attachments: []cnidriver.Attachment{a}})
	mustOK(t, "ADD a", res)
	ip := podIP(t, res.Outcomes[0])
	want := []string{fmt.Sprintf("512:\tfrom all to %s lookup main proto 168", ip), fmt.Sprintf("1536:\tfrom %s lookup 100 proto 168", ip)}
	for _, w := range want {
		if !strings.Contains(n.rules(), w) {
			t.Fatalf("after ADD, no rule %q:\n%s", w, n.rules())
		}
	}
	mustOK(t, "CHECK a", n.run(cnidriver.Request{Op: "check", ConfList: list, Attachments: []cnidriver.Attachment{a}}))
	prev := string(res.Outcomes[0].Result)
	mustOK(t, "DEL a", n.run(cnidriver.Request{Op: "del", ConfList: list, Attachments: []cnidriver.Attachment{a}}))
	if r := n.rules(); strings.Contains(r, ip.String()) {
		t.Fatalf("after DEL, rules of %s remain:\n%s", ip, r)
	}

	b := n.pod("b")
	res = n.run(cnidriver.Request{Op: "add", ConfList: list, Attachments: []cnidriver.Attachment{b}})
	mustOK(t, "ADD b", res)
	if got := podIP(t, res.Outcomes[0]); got != ip {
		t.Fatalf("pod b got %s, want the reused %s", got, ip)
	}
	// The runtime repeats a's DEL with its old prevResult.
	conf := fmt.Sprintf(`{"cniVersion":"1.1.0","name":"twillnet","type":"twill","subnetFile":%q,"dataDir":%q,"prevResult":%s}`, n.subnetFile, n.dataDir, prev)
	cmd := exec.Command("ip", "netns", "exec", n.ns, "env", "CNI_COMMAND=DEL", "CNI_CONTAINERID=a", "CNI_NETNS="+a.Netns, "CNI_IFNAME=eth0",
		"CNI_PATH="+n.bin, n.bin+"/twill")
	cmd.Stdin = strings.NewReader(conf)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("repeated DEL a: %v: %s", err, out)
	}
	for _, w := range want {
		if !strings.Contains(n.rules(), w) {
			t.Errorf("a late DEL of a removed pod b's rule %q:\n%s", w, n.rules())
		}
	}
	mustOK(t, "CHECK b", n.run(cnidriver.Request{Op: "check", ConfList: list, Attachments: []cnidriver.Attachment{b}}))
	mustOK(t, "DEL b", n.run(cnidriver.Request{Op: "del", ConfList: list, Attachments: []cnidriver.Attachment{b}}))
	if r := n.rules(); strings.Contains(r, "proto 168") {
		t.Errorf("rules left after DEL of every pod:\n%s", r)
	}
	n.requireClean()
}
