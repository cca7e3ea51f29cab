package e2e

import (
	"context"
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

	"github.com/twill-net/twill/lab/cnidriver"
	"github.com/twill-net/twill/nl"
	"github.com/twill-net/twill/testsupport/netnstest"
)

// TestEtcdUnreachableSaysSo: twilld and twillctl pointed at an etcd that is
// not there say so, naming the endpoint and why, within seconds; neither
// sits silent.
func TestEtcdUnreachableSaysSo(t *testing.T) {
	beside(t)
	bin := binaries(t)
	ns := netnstest.New(t, "noetcd")
	netnstest.Uplink(t, ns, "10.77.0.1/24")
	endpoint := "http://127.0.0.1:23790" // nothing listens there
	p := start(t, ns, filepath.Join(t.TempDir(), "twilld.log"), bin+"/twilld", "--etcd-endpoints", endpoint, "--iface", "eth0",
		"--subnet-file", filepath.Join(t.TempDir(), "subnet.env"))
	waitFor(t, 10*time.Second, "twilld to name the unreachable etcd", func() bool {
		out := p.Output()
		return strings.Contains(out, "cannot reach etcd") && strings.Contains(out, endpoint) && strings.Contains(out, "connection refused")
	})
	for _, args := range [][]string{{"config", "get"}, {"leases"}} {
		start := time.Now()
		cmd := exec.Command("ip", append([]string{"netns", "exec", ns, bin + "/twillctl"}, append(args, "--etcd-endpoints", endpoint)...)...)
		out, err := cmd.CombinedOutput()
		if err == nil || !strings.Contains(string(out), endpoint) || !strings.Contains(string(out), "connection refused") {
			t.Errorf("twillctl %s against a closed port: %v\n%s", strings.Join(args, " "), err, out)
		}
		t.Logf("twillctl %s gave up after %s: %s", strings.Join(args, " "), time.Since(start).Round(100*time.Millisecond), strings.TrimSpace(string(out)))
	}
}

// TestTwillctlEtcdAuth: every twillctl command that talks to etcd takes
// twilld's authentication flags.
func TestTwillctlEtcdAuth(t *testing.T) {
	beside(t)
	c := newCluster(t, 1)
	c.put("/twill.io/network/config", netConfHostGW)
	c.startDaemon(0)
	c.env(0)
	ctx := context.Background()
	for _, step := range []func() error{
		func() error { _, err := c.cli.UserAdd(ctx, "root", "s3cret"); return err },
		func() error { _, err := c.cli.UserGrantRole(ctx, "root", "root"); return err },
		func() error { _, err := c.cli.AuthEnable(ctx); return err },
	} {
		if err := step(); err != nil {
			t.Fatal(err)
		}
	}
	ns := c.topo.Nodes[0].NS
	twillctl := func(args ...string) (string, error) {
		out, err := exec.Command("ip", append([]string{"netns", "exec", ns, c.bin + "/twillctl"}, args...)...).CombinedOutput()
		return string(out), err
	}
	// The password from a file (not on a command line every local user
	// reads); --etcd-password itself still works.
	pwFile := filepath.Join(t.TempDir(), "etcd-password")
	if err := os.WriteFile(pwFile, []byte("s3cret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	auth := []string{"--etcd-endpoints", c.etcdURL, "--etcd-username", "root", "--etcd-password-file", pwFile}
	if out, err := twillctl("config", "get", "--etcd-endpoints", c.etcdURL, "--etcd-username", "root", "--etcd-password", "s3cret"); err != nil {
		t.Errorf("twillctl config get with --etcd-password: %v\n%s", err, out)
	}
	conf := filepath.Join(t.TempDir(), "net-conf.json")
	if err := os.WriteFile(conf, []byte(netConfHostGW), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{
		{"config", "get"},
		{"config", "put", conf},
		{"leases"},
		{"status", "--subnet-file", c.subnetFile(0), "--iface", "eth0"},
	} {
		if out, err := twillctl(append(args, auth...)...); err != nil {
			t.Errorf("twillctl %s with credentials: %v\n%s", strings.Join(args, " "), err, out)
		}
		if out, err := twillctl(append(args, "--etcd-endpoints", c.etcdURL)...); err == nil {
			t.Errorf("twillctl %s without credentials succeeded against an etcd with auth:\n%s", strings.Join(args, " "), out)
		}
	}
}

// TestConfigPutValidates: twillctl config put refuses what twilld would
// refuse, the backend's strict decoding included, naming the field and the
// value, and stores nothing.
func TestConfigPutValidates(t *testing.T) {
	beside(t)
	c := newCluster(t, 1)
	c.put("/twill.io/network/config", netConfHostGW)
	ns := c.topo.Nodes[0].NS
	for _, tt := range []struct{ conf, want string }{
		{`{"Network":"10.244.0.0/16","Backend":{"Type":"vxlen"}}`, `Backend.Type "vxlen": unknown backend type (registered: eni, host-gw, vxlan, wireguard)`},
		{`{"Network":"10.244.0.0/16","Backend":{"Type":"host-gw","VNI":1}}`, `Backend: unknown key "VNI"`},
		{`{"Network":"10.244.0.0/16","Backend":{"Type":"vxlan","VNI":"one"}}`, `Backend.VNI "one": must be a whole number`},
		{`{"Network":"10.244.0.0/16","Backend":{"Type":"vxlan","Port":70000}}`, `Backend.Port 70000`},
		{`{"Network":"10.244.0.0/16","SubnetLen":"abc"}`, `SubnetLen "abc": must be a whole number`},
	} {
		cmd := exec.Command("ip", "netns", "exec", ns, c.bin+"/twillctl", "config", "put", "-", "--etcd-endpoints", c.etcdURL)
		cmd.Stdin = strings.NewReader(tt.conf)
		out, err := cmd.CombinedOutput()
		if err == nil || !strings.Contains(string(out), tt.want) {
			t.Errorf("config put %s: %v\n%s\nwant an error containing %q", tt.conf, err, out, tt.want)
		}
	}
	resp, err := c.cli.Get(context.Background(), "/twill.io/network/config")
	if err != nil || len(resp.Kvs) != 1 || string(resp.Kvs[0].Value) != netConfHostGW {
		t.Fatalf("the stored configuration changed: %v %v", resp, err)
	}
}

// TestCNIDelWithMissingChainedPlugin: with portmap chained but not
// installed, ADD fails (saying so) and the DEL that follows still releases
// twill's part: no veth, no route, no allocation left. twillctl cni run
// exits non-zero when an outcome is an error.
func TestCNIDelWithMissingChainedPlugin(t *testing.T) {
	beside(t)
	c := newCluster(t, 1)
	c.put("/twill.io/network/config", netConfHostGW)
	c.startDaemon(0)
	c.env(0)
	nodeNS := c.topo.Nodes[0].NS
	podNS := nodeNS + "-pm"
	if out, err := exec.Command("ip", "netns", "add", podNS).CombinedOutput(); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", podNS).Run() })
	state := filepath.Join(c.dir, c.topo.Nodes[0].Name)
	list := fmt.Sprintf(`{"cniVersion":"1.0.0","name":"chained","plugins":[{"type":"twill","subnetFile":%q,"dataDir":%q},
		{"type":"portmap","capabilities":{"portMappings":true}}]}`, c.subnetFile(0), filepath.Join(state, "networks"))
	req := func(op string) (cnidriver.Outcome, int) {
		body, _ := json.Marshal(cnidriver.Request{Op: op, ConfList: json.RawMessage(list), BinDirs: []string{c.bin}, CacheDir: filepath.Join(state, "cni-cache"),
			Attachments: []cnidriver.Attachment{{ContainerID: "pm1", IfName: "eth0", Netns: "/var/run/netns/" + podNS}}})
		cmd := exec.Command("ip", "netns", "exec", nodeNS, c.bin+"/twillctl", "cni", "run")
		cmd.Stdin = strings.NewReader(string(body))
		out, err := cmd.Output()
		code := 0
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			code = ee.ExitCode()
		}
		var resp cnidriver.Response
		if jerr := json.Unmarshal(out, &resp); jerr != nil || len(resp.Outcomes) != 1 {
			t.Fatalf("cni run %s: %s (%v, %v)", op, out, err, jerr)
		}
		return resp.Outcomes[0], code
	}
	add, code := req("add")
	if !strings.Contains(add.Error, `failed to find plugin "portmap"`) || code != 2 {
		t.Fatalf("ADD with portmap missing: %q, exit %d; want the missing plugin named and exit 2", add.Error, code)
	}
	veth := nl.PodLinkName("pm1", "eth0")
	del, code := req("del")
	if !strings.Contains(del.Error, `plugin "portmap" is not installed`) || code != 2 {
		t.Errorf("DEL with portmap missing: %q, exit %d; want it reported and exit 2", del.Error, code)
	}
	if out, _ := exec.Command("ip", "-n", nodeNS, "link", "show", veth).CombinedOutput(); !strings.Contains(string(out), "does not exist") {
		t.Errorf("twill's veth %s left after DEL:\n%s", veth, out)
	}
	if routes, _ := exec.Command("ip", "-n", nodeNS, "route", "show", "proto", "168").CombinedOutput(); strings.TrimSpace(string(routes)) != "" {
		t.Errorf("pod routes left after DEL:\n%s", routes)
	}
	ents, _ := os.ReadDir(filepath.Join(state, "networks", "chained"))
	for _, e := range ents {
		if _, err := netip.ParseAddr(e.Name()); err == nil {
			t.Errorf("allocation %s left after DEL", e.Name())
		}
	}
}

// TestStatusReportsRefusedPeers: a host-gw peer whose public IP is not
// on-link is not programmed; twillctl status says so, with the reason, and
// exits non-zero although the kernel matches the rest.
func TestStatusReportsRefusedPeers(t *testing.T) {
	beside(t)
	c := newCluster(t, 2)
	// The nodes' subnets stay away from the test's own lease (10.244.240.0).
	c.put("/twill.io/network/config", `{"Network":"10.244.0.0/16","SubnetMin":"10.244.1.0","SubnetMax":"10.244.199.0","Backend":{"Type":"host-gw"}}`)
	c.startDaemon(0)
	c.startDaemon(1)
	peer := c.env(1).Subnet
	waitFor(t, 10*time.Second, "node1's route to node2", func() bool { return strings.Contains(c.routes(0), peer.String()) })
	c.put("/twill.io/network/subnets/10.244.240.0-24", `{"PublicIP":"10.98.0.5","BackendType":"host-gw"}`)
	ns := c.topo.Nodes[0].NS
	var out []byte
	var err error
	waitFor(t, 10*time.Second, "status to report the refused peer", func() bool {
		out, err = exec.Command("ip", "netns", "exec", ns, c.bin+"/twillctl", "status", "--etcd-endpoints", c.etcdURL,
			"--subnet-file", c.subnetFile(0), "--iface", "eth0").CombinedOutput()
		return strings.Contains(string(out), "10.244.240.0/24 via 10.98.0.5: not on-link")
	})
	if err == nil || !strings.Contains(string(out), "1 valid, 1 refused") || !strings.Contains(string(out), "in sync") {
		t.Errorf("status with a peer not on-link: %v\n%s", err, out)
	}
}

// TestLabExecTwillctl: the in-lab commands of the docs work as written:
// twill's binaries by name, with the node's paths.
func TestLabExecTwillctl(t *testing.T) {
	beside(t)
	l := newLabCtl(t)
	n := labName("x")
	l.up(n, "--nodes", "2", "--pods-per-node", "1")
	for _, args := range [][]string{
		{"node1", "--", "twillctl", "status"},
		{"node1", "--", "twillctl", "leases"},
		{"node1", "--", "twillctl", "config", "get"},
	} {
		out, err := l.run(append([]string{"exec", "--name", n}, args...)...)
		if err != nil {
			t.Errorf("lab exec %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	out, _ := l.run("exec", "--name", n, "node1", "--", "twillctl", "status")
	if !strings.Contains(out, "in sync") {
		t.Errorf("lab exec node1 -- twillctl status:\n%s", out)
	}
	// A failing command's status is lab exec's, with nothing added.
	out, err := l.run("exec", "--name", n, "node1", "--", "sh", "-c", "exit 3")
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 3 || strings.Contains(out, "twillctl:") {
		t.Errorf("lab exec of a command exiting 3: %v\n%q", err, out)
	}
}
