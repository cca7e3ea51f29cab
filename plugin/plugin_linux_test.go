package plugin_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"

	"github.com/twill-net/twill/lab/cnidriver"
	"github.com/twill-net/twill/testsupport/netnstest"
)

var specVersions = []string{"0.3.1", "0.4.0", "1.0.0", "1.1.0"}

func TestPrivilegedAddCheckDel(t *testing.T) {
	for _, v := range specVersions {
		t.Run(v, func(t *testing.T) {
			n := newNode(t, "10.244.7.0/24")
			list := n.conflist(v)
			a, b := n.pod("pod-a"), n.pod("pod-b")
			resp := n.run(cnidriver.Request{Op: "add", ConfList: list, Attachments: []cnidriver.Attachment{a, b}})
			mustOK(t, "ADD", resp)
			ipA, ipB := podIP(t, resp.Outcomes[0]), podIP(t, resp.Outcomes[1])
			subnet := netip.MustParsePrefix("10.244.7.0/24")
			if !subnet.Contains(ipA) || !subnet.Contains(ipB) || ipA == ipB {
				t.Fatalf("pods got %s and %s; want two distinct addresses in %s", ipA, ipB, subnet)
			}
			var r map[string]any
			_ = json.Unmarshal(resp.Outcomes[0].Result, &r)
			if r["cniVersion"] != v {
				t.Errorf("result cniVersion %v, want %s", r["cniVersion"], v)
			}
			if v != "0.3.1" { // CHECK exists from 0.4.0 on
				mustOK(t, "CHECK", n.run(cnidriver.Request{Op: "check", ConfList: list, Attachments: []cnidriver.Attachment{a, b}}))
			}
			for _, dst := range []netip.Addr{n.addr, ipB} {
				if err := pingFrom(nsName(a.Netns), dst); err != nil {
					t.Fatal(err)
				}
			}
			mtu, _ := exec.Command("ip", "-n", nsName(a.Netns), "-o", "link", "show", "eth0").CombinedOutput()
			if !strings.Contains(string(mtu), "mtu 1450") {
				t.Errorf("pod MTU is not subnet.env's 1450: %s", mtu)
			}
			mustOK(t, "DEL", n.run(cnidriver.Request{Op: "del", ConfList: list, Attachments: []cnidriver.Attachment{a, b}}))
			n.requireClean()
		})
	}
}

func TestPrivilegedChainedWithPortmap(t *testing.T) {
	n := newNode(t, "10.244.7.0/24")
	list := n.conflist("1.1.0", `{"type":"portmap","capabilities":{"portMappings":true}}`)
	p := n.pod("chained")
	mustOK(t, "ADD", n.run(cnidriver.Request{Op: "add", ConfList: list, Attachments: []cnidriver.Attachment{p}}))
	mustOK(t, "CHECK", n.run(cnidriver.Request{Op: "check", ConfList: list, Attachments: []cnidriver.Attachment{p}}))
	mustOK(t, "DEL", n.run(cnidriver.Request{Op: "del", ConfList: list, Attachments: []cnidriver.Attachment{p}}))
	n.requireClean()
}

func TestPrivilegedCheckReportsHandDeletedRoute(t *testing.T) {
	n := newNode(t, "10.244.7.0/24")
	list := n.conflist("1.1.0")
	p := n.pod("check")
	mustOK(t, "ADD", n.run(cnidriver.Request{Op: "add", ConfList: list, Attachments: []cnidriver.Attachment{p}}))
	netnstest.IP(t, nsName(p.Netns), "route", "del", "default")
	resp := n.run(cnidriver.Request{Op: "check", ConfList: list, Attachments: []cnidriver.Attachment{p}})
	if e := resp.Outcomes[0].Error; !strings.Contains(e, "route default via 169.254.1.1 dev eth0 missing") {
		t.Fatalf("CHECK error %q: want it to name the missing route", e)
	}
	mustOK(t, "DEL", n.run(cnidriver.Request{Op: "del", ConfList: list, Attachments: []cnidriver.Attachment{p}}))
}

func TestPrivilegedDelIsIdempotent(t *testing.T) {
	n := newNode(t, "10.244.7.0/24")
	list := n.conflist("1.1.0")
	p := n.pod("del")
	mustOK(t, "ADD", n.run(cnidriver.Request{Op: "add", ConfList: list, Attachments: []cnidriver.Attachment{p}}))
	// The daemon is gone (no subnet.env) and so is the pod's namespace:
	// DEL still cleans up, from the allocator's record and the veth's name.
	if err := os.Remove(n.subnetFile); err != nil {
		t.Fatal(err)
	}
	netnstest.Delete(nsName(p.Netns))
	for i := range 2 {
		mustOK(t, fmt.Sprintf("DEL #%d", i+1), n.run(cnidriver.Request{Op: "del", ConfList: list, Attachments: []cnidriver.Attachment{p}}))
	}
	n.requireClean()
}

func TestPrivilegedParallel100(t *testing.T) {
	n := newNode(t, "10.244.7.0/24")
	list := n.conflist("1.1.0")
	var pods []cnidriver.Attachment
	for i := range 100 {
		pods = append(pods, n.pod(fmt.Sprintf("par-%03d", i)))
	}
	resp := n.run(cnidriver.Request{Op: "add", ConfList: list, Attachments: pods, Parallel: true})
	mustOK(t, "ADD", resp)
	seen := map[netip.Addr]string{}
	for i, o := range resp.Outcomes {
		ip := podIP(t, o)
		if prev, dup := seen[ip]; dup {
			t.Fatalf("%s and %s both got %s", prev, pods[i].ContainerID, ip)
		}
		seen[ip] = pods[i].ContainerID
	}
	for ip := range seen {
		if err := pingFrom(n.ns, ip); err != nil {
			t.Fatal(err)
		}
	}
	mustOK(t, "DEL", n.run(cnidriver.Request{Op: "del", ConfList: list, Attachments: pods, Parallel: true}))
	n.requireClean()
}

func TestPrivilegedFaults(t *testing.T) {
	t.Run("nonexistent netns", func(t *testing.T) {
		n := newNode(t, "10.244.7.0/24")
		p := cnidriver.Attachment{ContainerID: "ghost", IfName: "eth0", Netns: "/var/run/netns/tw-does-not-exist"}
		resp := n.run(cnidriver.Request{Op: "add", ConfList: n.conflist("1.1.0"), Attachments: []cnidriver.Attachment{p}})
		if e := resp.Outcomes[0].Error; !strings.Contains(e, "tw-does-not-exist") {
			t.Fatalf("error %q: want it to name the netns", e)
		}
		n.requireClean()
	})
	t.Run("bad ifname", func(t *testing.T) {
		n := newNode(t, "10.244.7.0/24")
		// skel validates CNI_IFNAME before the plugin's own code runs.
		for name, want := range map[string]string{
			"eth0-with-a-long-name": "interface name is too long",
			"eth/0":                 "interface name",
		} {
			p := n.pod("badif")
			p.IfName = name
			resp := n.run(cnidriver.Request{Op: "add", ConfList: n.conflist("1.1.0"), Attachments: []cnidriver.Attachment{p}})
			if e := resp.Outcomes[0].Error; !strings.Contains(e, want) {
				t.Fatalf("CNI_IFNAME %q: error %q, want %q", name, e, want)
			}
		}
		n.requireClean()
	})
	t.Run("daemon has not written subnet.env", func(t *testing.T) {
		n := newNode(t, "")
		resp := n.run(cnidriver.Request{Op: "add", ConfList: n.conflist("1.1.0"), Attachments: []cnidriver.Attachment{n.pod("early")}})
		if e := resp.Outcomes[0].Error; !strings.Contains(e, "has not written it yet") || !strings.Contains(e, n.subnetFile) {
			t.Fatalf("error %q: want it to say the daemon has not written %s", e, n.subnetFile)
		}
		st := n.run(cnidriver.Request{Op: "status", ConfList: n.conflist("1.1.0")})
		if e := st.Outcomes[0].Error; !strings.Contains(e, "not ready") {
			t.Fatalf("STATUS error %q: want not ready", e)
		}
		n.requireClean()
	})
	t.Run("exhausted pool", func(t *testing.T) {
		n := newNode(t, "10.244.7.0/30") // one usable address: .2
		list := n.conflist("1.1.0")
		first, second := n.pod("first"), n.pod("second")
		mustOK(t, "STATUS", n.run(cnidriver.Request{Op: "status", ConfList: list}))
		mustOK(t, "ADD", n.run(cnidriver.Request{Op: "add", ConfList: list, Attachments: []cnidriver.Attachment{first}}))
		resp := n.run(cnidriver.Request{Op: "add", ConfList: list, Attachments: []cnidriver.Attachment{second}})
		if e := resp.Outcomes[0].Error; !strings.Contains(e, "allocating an address in 10.244.7.0/30") {
			t.Fatalf("error %q: want it to name the exhausted subnet", e)
		}
		st := n.run(cnidriver.Request{Op: "status", ConfList: list})
		if e := st.Outcomes[0].Error; !strings.Contains(e, "no free address in 10.244.7.0/30") {
			t.Fatalf("STATUS error %q: want the pool reported full", e)
		}
		mustOK(t, "DEL", n.run(cnidriver.Request{Op: "del", ConfList: list, Attachments: []cnidriver.Attachment{first, second}}))
		n.requireClean()
	})
	t.Run("second ADD of an attachment", func(t *testing.T) {
		n := newNode(t, "10.244.7.0/24")
		list := n.conflist("1.1.0")
		p := n.pod("twice")
		resp := n.run(cnidriver.Request{Op: "add", ConfList: list, Attachments: []cnidriver.Attachment{p}})
		mustOK(t, "ADD", resp)
		ip := podIP(t, resp.Outcomes[0])
		again := n.run(cnidriver.Request{Op: "add", ConfList: list, Attachments: []cnidriver.Attachment{p}})
		if e := again.Outcomes[0].Error; !strings.Contains(e, "already has eth0") || !strings.Contains(e, "DEL first") {
			t.Fatalf("second ADD: error %q, want it refused as already attached", e)
		}
		// The refused ADD took no second address and left the first pod
		// wired: one allocation, and the pod still reaches its node.
		files, _ := filepath.Glob(filepath.Join(n.dataDir, "twillnet", "10.*"))
		if len(files) != 1 || filepath.Base(files[0]) != ip.String() {
			t.Fatalf("allocations after the refused ADD: %v, want only %s", files, ip)
		}
		if err := pingFrom(nsName(p.Netns), n.addr); err != nil {
			t.Fatalf("first pod after the refused ADD: %v", err)
		}
		mustOK(t, "DEL", n.run(cnidriver.Request{Op: "del", ConfList: list, Attachments: []cnidriver.Attachment{p}}))
		n.requireClean()
	})
	t.Run("corrupt allocation files", func(t *testing.T) {
		n := newNode(t, "10.244.7.0/24")
		dir := filepath.Join(n.dataDir, "twillnet")
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		// A garbled last_reserved_ip and an address file with junk in it.
		if err := os.WriteFile(filepath.Join(dir, "last_reserved_ip.0"), []byte("\x00garbage"), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "10.244.7.2"), []byte("\xff\xfe not an id"), 0o600); err != nil {
			t.Fatal(err)
		}
		list := n.conflist("1.1.0")
		p := n.pod("corrupt")
		resp := n.run(cnidriver.Request{Op: "add", ConfList: list, Attachments: []cnidriver.Attachment{p}})
		mustOK(t, "ADD", resp)
		if ip := podIP(t, resp.Outcomes[0]); ip.String() == "10.244.7.2" {
			t.Fatal("an address whose file exists was handed out again")
		}
		mustOK(t, "DEL", n.run(cnidriver.Request{Op: "del", ConfList: list, Attachments: []cnidriver.Attachment{p}}))
		// GC with no valid attachment reclaims the junk file too.
		mustOK(t, "GC", n.run(cnidriver.Request{Op: "gc", ConfList: list}))
		n.requireClean()
	})
}

// TestPrivilegedKilledMidAddThenGC kills the plugin at different points of
// ADD; GC then leaves nothing behind.
func TestPrivilegedKilledMidAddThenGC(t *testing.T) {
	n := newNode(t, "10.244.7.0/24")
	list := n.conflist("1.1.0")
	var conf map[string]any
	_ = json.Unmarshal(list, &conf)
	plugin := conf["plugins"].([]any)[0].(map[string]any)
	plugin["cniVersion"], plugin["name"] = "1.1.0", "twillnet"
	stdin, _ := json.Marshal(plugin)
	killed := 0
	for i := range 12 {
		p := n.pod(fmt.Sprintf("kill-%d", i))
		cmd := exec.Command("ip", "netns", "exec", n.ns, n.bin+"/twill")
		cmd.Env = append(os.Environ(), "CNI_COMMAND=ADD", "CNI_CONTAINERID="+p.ContainerID, "CNI_NETNS="+p.Netns,
			"CNI_IFNAME=eth0", "CNI_PATH="+n.bin)
		cmd.Stdin = strings.NewReader(string(stdin))
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Duration(i) * time.Millisecond) // a different point of ADD each time
		if cmd.Process.Kill() == nil {
			killed++
		}
		_ = cmd.Wait()
	}
	t.Logf("killed %d ADDs part-way; state before GC:\n%s", killed, n.leftovers())
	mustOK(t, "GC", n.run(cnidriver.Request{Op: "gc", ConfList: list, Valid: []types.GCAttachment{}}))
	n.requireClean()
}

func TestPrivilegedGCKeepsValidAttachments(t *testing.T) {
	n := newNode(t, "10.244.7.0/24")
	list := n.conflist("1.1.0")
	pods := []cnidriver.Attachment{n.pod("keep"), n.pod("drop-1"), n.pod("drop-2")}
	resp := n.run(cnidriver.Request{Op: "add", ConfList: list, Attachments: pods})
	mustOK(t, "ADD", resp)
	var kept current.Result
	_ = json.Unmarshal(resp.Outcomes[0].Result, &kept)
	mustOK(t, "GC", n.run(cnidriver.Request{Op: "gc", ConfList: list, Valid: []types.GCAttachment{{ContainerID: "keep", IfName: "eth0"}}}))
	left := n.leftovers()
	if strings.Count(left, "link ") != 1 || strings.Count(left, "allocation ") != 1 {
		t.Fatalf("after GC want exactly the kept pod's link and allocation, have:\n%s", left)
	}
	mustOK(t, "CHECK", n.run(cnidriver.Request{Op: "check", ConfList: list, Attachments: pods[:1]}))
	if err := pingFrom(nsName(pods[0].Netns), n.addr); err != nil {
		t.Fatal(err)
	}
	mustOK(t, "DEL", n.run(cnidriver.Request{Op: "del", ConfList: list, Attachments: pods[:1]}))
	n.requireClean()
}

// With an ipam section, twill asks that IPAM plugin (host-local here) for
// the pod's address, checks and releases through it; a type that names no
// plugin fails ADD with the field and its value.
func TestPrivilegedDelegatedIPAM(t *testing.T) {
	n := newNode(t, "10.244.7.0/24")
	ipamDir := filepath.Join(n.dir, "host-local")
	list := json.RawMessage(fmt.Sprintf(`{"cniVersion":"1.0.0","name":"twillnet","plugins":[{"type":"twill","subnetFile":%q,"dataDir":%q,
		"ipam":{"type":"host-local","dataDir":%q,"ranges":[[{"subnet":"10.244.7.0/24","rangeStart":"10.244.7.200"}]]}}]}`, n.subnetFile, n.dataDir, ipamDir))
	p := n.pod("delegated")
	resp := n.run(cnidriver.Request{Op: "add", ConfList: list, Attachments: []cnidriver.Attachment{p}})
	mustOK(t, "ADD", resp)
	ip := podIP(t, resp.Outcomes[0])
	if ip != netip.MustParseAddr("10.244.7.200") {
		t.Fatalf("pod got %s, want host-local's first, 10.244.7.200", ip)
	}
	held := filepath.Join(ipamDir, "twillnet", ip.String())
	if _, err := os.Stat(held); err != nil {
		t.Fatalf("host-local holds no file for %s: %v", ip, err)
	}
	if err := pingFrom(nsName(p.Netns), n.addr); err != nil {
		t.Fatal(err)
	}
	mustOK(t, "CHECK", n.run(cnidriver.Request{Op: "check", ConfList: list, Attachments: []cnidriver.Attachment{p}}))
	mustOK(t, "DEL", n.run(cnidriver.Request{Op: "del", ConfList: list, Attachments: []cnidriver.Attachment{p}}))
	if _, err := os.Stat(held); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("after DEL host-local still holds %s (%v)", ip, err)
	}
	n.requireClean()

	for _, typ := range []string{"no-such-ipam", "../host-local"} {
		bad := json.RawMessage(strings.Replace(string(list), `"type":"host-local"`, fmt.Sprintf(`"type":%q`, typ), 1))
		q := n.pod("bad-" + strings.Trim(typ, "./"))
		resp := n.run(cnidriver.Request{Op: "add", ConfList: bad, Attachments: []cnidriver.Attachment{q}})
		if e := resp.Outcomes[0].Error; !strings.Contains(e, fmt.Sprintf("ipam.type %q", typ)) {
			t.Errorf("ADD with ipam type %q: error %q, want one naming ipam.type and the value", typ, e)
		}
	}
	n.requireClean()
}
