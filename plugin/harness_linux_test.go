package plugin_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	current "github.com/containernetworking/cni/pkg/types/100"

	"github.com/twill-net/twill/lab/cnidriver"
	"github.com/twill-net/twill/subnet"
	"github.com/twill-net/twill/testsupport/buildtest"
	"github.com/twill-net/twill/testsupport/netnstest"
)

func TestMain(m *testing.M) {
	code := m.Run()
	buildtest.Cleanup()
	os.Exit(code)
}

// binDir builds the twill plugin and twillctl, plus the upstream plugins
// used as references and chain partners (ptp, host-local, portmap), from
// the module's own dependencies (pinned in internal/tools).
func binDir(t testing.TB) string {
	t.Helper()
	return buildtest.Binaries(t, "github.com/twill-net/twill/cmd/twill", "github.com/twill-net/twill/cmd/twill-lab",
		"github.com/containernetworking/plugins/plugins/main/ptp",
		"github.com/containernetworking/plugins/plugins/ipam/host-local",
		"github.com/containernetworking/plugins/plugins/meta/portmap")
}

// node is a simulated node: a namespace with an address on eth0, a
// subnet.env as the daemon would write it, and a CNI data directory.
type node struct {
	t          testing.TB
	ns         string
	dir        string
	subnetFile string
	dataDir    string
	addr       netip.Addr
	bin        string
}

func newNode(t testing.TB, subnetCIDR string) *node {
	t.Helper()
	netnstest.RequireRoot(t)
	n := &node{t: t, ns: netnstest.New(t, "cni"), dir: t.TempDir(), addr: netip.MustParseAddr("192.168.50.1"), bin: binDir(t)}
	netnstest.Uplink(t, n.ns, "192.168.50.1/24")
	if out, err := netnstest.Exec(n.ns, "sh", "-c", "echo 1 > /proc/sys/net/ipv4/ip_forward"); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	n.subnetFile = filepath.Join(n.dir, "subnet.env")
	n.dataDir = filepath.Join(n.dir, "networks")
	if subnetCIDR != "" {
		n.writeEnv(subnetCIDR)
	}
	return n
}

func (n *node) writeEnv(subnetCIDR string) {
	err := subnet.WriteEnv(n.subnetFile, subnet.Env{
		Network: netip.MustParsePrefix("10.244.0.0/16"), Subnet: netip.MustParsePrefix(subnetCIDR),
		MTU: 1450, Backend: "host-gw",
	})
	if err != nil {
		n.t.Fatal(err)
	}
}

// conflist is a twill network list at the given spec version; extra
// plugins are appended to the chain.
func (n *node) conflist(version string, extra ...string) json.RawMessage {
	plugins := []string{fmt.Sprintf(`{"type":"twill","subnetFile":%q,"dataDir":%q}`, n.subnetFile, n.dataDir)}
	plugins = append(plugins, extra...)
	return json.RawMessage(fmt.Sprintf(`{"cniVersion":%q,"name":"twillnet","plugins":[%s]}`, version, strings.Join(plugins, ",")))
}

// pod makes a pod namespace and returns its attachment.
func (n *node) pod(id string) cnidriver.Attachment {
	ns := netnstest.New(n.t, "pod")
	return cnidriver.Attachment{ContainerID: id, IfName: "eth0", Netns: "/var/run/netns/" + ns}
}

// run drives libcni inside the node's namespace.
func (n *node) run(req cnidriver.Request) cnidriver.Response {
	n.t.Helper()
	req.BinDirs = []string{n.bin}
	if req.CacheDir == "" {
		req.CacheDir = filepath.Join(n.dir, "cache")
	}
	resp, err := cnidriver.RunIn(context.Background(), n.bin+"/twill-lab", n.ns, req)
	if err != nil {
		n.t.Fatal(err)
	}
	return resp
}

// mustOK fails the test on any operation error.
func mustOK(t testing.TB, op string, resp cnidriver.Response) {
	t.Helper()
	for i, o := range resp.Outcomes {
		if o.Error != "" {
			t.Fatalf("%s #%d: %s", op, i, o.Error)
		}
	}
}

// podIP extracts the pod's address from an ADD result.
func podIP(t testing.TB, o cnidriver.Outcome) netip.Addr {
	t.Helper()
	var r current.Result
	if err := json.Unmarshal(o.Result, &r); err != nil || len(r.IPs) == 0 {
		t.Fatalf("ADD result %s: %v", o.Result, err)
	}
	a, _ := netip.AddrFromSlice(r.IPs[0].Address.IP)
	return a.Unmap()
}

func nsName(netnsPath string) string { return filepath.Base(netnsPath) }

func pingFrom(ns string, dst netip.Addr) error {
	out, err := exec.Command("ip", "netns", "exec", ns, "ping", "-c", "1", "-W", "2", dst.String()).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ping %s from %s: %w: %s", dst, ns, err, out)
	}
	return nil
}

// leftovers describes any twill state left in the node: host veths, pod
// routes and allocation files.
func (n *node) leftovers() string {
	var b strings.Builder
	links, _ := exec.Command("ip", "-n", n.ns, "-o", "link", "show").CombinedOutput()
	for _, l := range strings.Split(string(links), "\n") {
		if f := strings.Fields(l); len(f) > 1 && strings.HasPrefix(f[1], "tw") {
			fmt.Fprintf(&b, "link %s\n", strings.TrimSuffix(f[1], ":"))
		}
	}
	routes, _ := exec.Command("ip", "-n", n.ns, "route", "show", "proto", "168").CombinedOutput()
	if s := strings.TrimSpace(string(routes)); s != "" {
		fmt.Fprintf(&b, "routes %s\n", s)
	}
	if set, err := exec.Command("ip", "netns", "exec", n.ns, "nft", "list", "set", "inet", "twill-antispoof", "pods").CombinedOutput(); err == nil && strings.Contains(string(set), "elements") {
		fmt.Fprintf(&b, "anti-spoofing members %s\n", strings.TrimSpace(string(set)))
	}
	ents, _ := os.ReadDir(filepath.Join(n.dataDir, "twillnet"))
	for _, e := range ents {
		if _, err := netip.ParseAddr(e.Name()); err == nil {
			fmt.Fprintf(&b, "allocation %s\n", e.Name())
		}
	}
	return b.String()
}

func (n *node) requireClean() {
	n.t.Helper()
	if left := n.leftovers(); left != "" {
		n.t.Fatalf("state left behind:\n%s", left)
	}
}
