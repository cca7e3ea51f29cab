package e2e

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/twill-net/twill/internal/netnstest"
)

// TestEtcdUnreachableSaysSo: twilld and twillctl pointed at an etcd that is
// not there say so, naming the endpoint and why, within seconds; neither
// sits silent.
func TestEtcdUnreachableSaysSo(t *testing.T) {
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
	auth := []string{"--etcd-endpoints", c.etcdURL, "--etcd-username", "root", "--etcd-password", "s3cret"}
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
