package e2e

import (
	"fmt"
	"net"
	"net/netip"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/twill-net/twill/internal/pki"
)

// etcdAuthPort is where TestEtcdTLSRBAC's etcd serves, beside the plain
// etcd every cluster has.
const etcdAuthPort = 2391

// TestEtcdTLSRBAC: twill against an etcd that requires client
// certificates and has RBAC on, with a role limited to twill's prefix (as
// Documentation/etcd.md creates it). The nodes work. Then a client holding
// the same credentials (a compromised node) overwrites node1's lease with
// node2's public IP: no node ever routes node1's subnet to node2, node1
// writes its lease back, and node1's twill_lease_conflicts_total counts 1.
func TestEtcdTLSRBAC(t *testing.T) {
	beside(t)
	c := newCluster(t, 3)
	etcdctl := builtTool(t, "etcd", "etcdctl")
	ca, err := pki.New(filepath.Join(c.dir, "pki"), "etcd-ca")
	if err != nil {
		t.Fatal(err)
	}
	issue := func(spec pki.Cert) (string, string) {
		crt, key, err := ca.Issue(spec)
		if err != nil {
			t.Fatal(err)
		}
		return crt, key
	}
	srvCrt, srvKey := issue(pki.Cert{Name: "etcd", CN: "etcd", Server: true, IPs: []netip.Addr{c.topo.BridgeAddr}})
	rootCrt, rootKey := issue(pki.Cert{Name: "root", CN: "root"})
	twCrt, twKey := issue(pki.Cert{Name: "twill", CN: "twill"})

	url := "https://" + net.JoinHostPort(c.topo.BridgeAddr.String(), strconv.Itoa(etcdAuthPort))
	start(t, c.topo.Underlay, filepath.Join(c.dir, "etcd-auth.log"), c.bin+"/twillctl", "etcd",
		"--data-dir", filepath.Join(c.dir, "etcd-auth"), "--listen-client-urls", url,
		"--cert-file", srvCrt, "--key-file", srvKey, "--trusted-ca-file", ca.CAFile(), "--client-cert-auth")
	ctl := func(crt, key string, args ...string) (string, error) {
		argv := append([]string{"netns", "exec", c.topo.Underlay, etcdctl, "--endpoints", url, "--cacert", ca.CAFile(),
			"--cert", crt, "--key", key, "--dial-timeout", "5s", "--command-timeout", "10s"}, args...)
		out, err := exec.Command("ip", argv...).CombinedOutput()
		return string(out), err
	}
	waitFor(t, 30*time.Second, "the TLS etcd to answer", func() bool { _, err := ctl(rootCrt, rootKey, "endpoint", "health"); return err == nil })
	// Documentation/etcd.md's roles and users.
	for _, args := range [][]string{
		{"user", "add", "root", "--no-password"},
		{"user", "grant-role", "root", "root"},
		{"role", "add", "twill"},
		{"role", "grant-permission", "twill", "readwrite", "--prefix=true", "/twill.io/network/"},
		{"user", "add", "twill", "--no-password"},
		{"user", "grant-role", "twill", "twill"},
		{"auth", "enable"},
		{"put", "/twill.io/network/config", netConfHostGW},
	} {
		if out, err := ctl(rootCrt, rootKey, args...); err != nil {
			t.Fatalf("etcdctl %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	// The role holds: twill's user cannot write outside its prefix.
	if out, err := ctl(twCrt, twKey, "put", "/registry/elsewhere", "x"); err == nil || !strings.Contains(out, "permission denied") {
		t.Fatalf("twill's user wrote outside /twill.io/network/: %v\n%s", err, out)
	}

	c.etcdURL = url
	for i := range c.topo.Nodes {
		extra := []string{"--etcd-cafile", ca.CAFile(), "--etcd-certfile", twCrt, "--etcd-keyfile", twKey}
		if i == 0 {
			extra = append(extra, "--healthz-ip", "127.0.0.1", "--healthz-port", fmt.Sprint(healthPort))
		}
		c.startDaemon(i, extra...)
	}
	envs := []netip.Prefix{c.env(0).Subnet, c.env(1).Subnet, c.env(2).Subnet}
	addr := func(i int) string { return c.topo.Nodes[i].Addr.Addr().String() }
	for i := range c.topo.Nodes {
		for j := range c.topo.Nodes {
			if i != j {
				waitFor(t, 15*time.Second, fmt.Sprintf("node%d's route to node%d", i+1, j+1), func() bool {
					return strings.Contains(c.routes(i), envs[j].String()+" via "+addr(j))
				})
			}
		}
	}

	// A client with twill's credentials points node1's subnet at node2.
	// Every route change on node2 and node3 is watched meanwhile: not
	// even a moment's route to node2 may appear.
	var monitors []*proc
	for _, i := range []int{1, 2} {
		monitors = append(monitors, start(t, c.topo.Nodes[i].NS, filepath.Join(c.dir, fmt.Sprintf("monitor%d.log", i+1)), "ip", "monitor", "route"))
	}
	time.Sleep(500 * time.Millisecond) // the monitors subscribed
	key := "/twill.io/network/subnets/" + strings.ReplaceAll(envs[0].String(), "/", "-")
	if out, err := ctl(twCrt, twKey, "put", key, `{"PublicIP":"`+addr(1)+`","BackendType":"host-gw"}`); err != nil {
		t.Fatalf("the rogue write: %v\n%s", err, out)
	}
	waitFor(t, 10*time.Second, "node1's lease written back", func() bool {
		out, err := ctl(twCrt, twKey, "get", key, "--print-value-only")
		return err == nil && strings.Contains(out, `"PublicIP":"`+addr(0)+`"`)
	})
	time.Sleep(time.Second) // any reaction of the peers' has happened
	rogue := envs[0].String() + " via " + addr(1)
	for k, m := range monitors {
		m.Stop(t)
		if strings.Contains(m.Output(), rogue) {
			t.Errorf("node%d routed node1's subnet to node2 at some point:\n%s", k+2, m.Output())
		}
	}
	for _, i := range []int{1, 2} {
		if !strings.Contains(c.routes(i), envs[0].String()+" via "+addr(0)) {
			t.Errorf("node%d lost its route to node1:\n%s", i+1, c.routes(i))
		}
	}
	if got := metricIn(t, c.topo.Nodes[0].NS, healthPort, "twill_lease_conflicts_total"); got != "1" {
		t.Errorf("node1's twill_lease_conflicts_total = %s, want 1", got)
	}
	if log := c.daemons[0].Output(); !strings.Contains(log, "this node's lease was overwritten by another client") {
		t.Errorf("node1 did not say its lease was overwritten:\n%s", log)
	}
}
