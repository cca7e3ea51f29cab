package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// healthPort is where the fault tests' daemons serve /metrics and /readyz.
const healthPort = 10267

// TestRoguePublicIPs: leases whose PublicIP is loopback, multicast,
// broadcast or link-local are refused by every vxlan node, named in the
// log, counted in twill_leases_refused and by twillctl status, and never
// become a route, a neighbour or an FDB entry.
func TestRoguePublicIPs(t *testing.T) {
	c := newCluster(t, 2)
	c.put("/twill.io/network/config", netConfVXLAN)
	d := c.startDaemon(0, "--healthz-ip", "127.0.0.1", "--healthz-port", fmt.Sprint(healthPort))
	c.startDaemon(1)
	local := c.env(0)
	peer := c.env(1)
	rogue := map[string]string{
		"10.244.250.0": "127.0.0.1",
		"10.244.251.0": "224.0.0.1",
		"10.244.252.0": "255.255.255.255",
		"10.244.253.0": "169.254.10.10",
	}
	for sub, ip := range rogue {
		c.put("/twill.io/network/subnets/"+sub+"-24",
			`{"PublicIP":"`+ip+`","BackendType":"vxlan","BackendData":{"VNI":1,"VtepMAC":"0a:bb:00:00:00:01"}}`)
	}
	// A good peer arriving after them: once it is routed, the rogue ones
	// have been considered too.
	waitFor(t, 10*time.Second, "node2's route on node1", func() bool { return strings.Contains(c.routes(0), peer.Subnet.String()+" via") })
	c.put("/twill.io/network/subnets/10.244.254.0-24",
		`{"PublicIP":"10.99.0.50","BackendType":"vxlan","BackendData":{"VNI":1,"VtepMAC":"0a:bb:00:00:00:02"}}`)
	waitFor(t, 10*time.Second, "the witness lease's route", func() bool { return strings.Contains(c.routes(0), "10.244.254.0/24") })

	ns := c.topo.Nodes[0].NS
	fdb, _ := exec.Command("bridge", "-n", ns, "fdb", "show", "dev", "twill.1").CombinedOutput()
	neigh, _ := exec.Command("ip", "-n", ns, "neigh", "show", "dev", "twill.1").CombinedOutput()
	routes := c.routes(0)
	for sub, ip := range rogue {
		if strings.Contains(routes, sub) {
			t.Errorf("route to the rogue lease %s (PublicIP %s):\n%s", sub, ip, routes)
		}
		if strings.Contains(string(fdb), "dst "+ip+" ") {
			t.Errorf("FDB entry towards %s:\n%s", ip, fdb)
		}
		if strings.Contains(string(neigh), sub+" ") {
			t.Errorf("neighbour for %s:\n%s", sub, neigh)
		}
	}
	log := d.Output()
	for _, want := range []string{"127.0.0.1 is a loopback address", "224.0.0.1 is a multicast address",
		"255.255.255.255 is the broadcast address", "169.254.10.10 is a link-local address"} {
		if strings.Count(log, want) != 1 {
			t.Errorf("node1's log names %q %d times, want once:\n%s", want, strings.Count(log, want), log)
		}
	}
	if got := metricIn(t, ns, healthPort, "twill_leases_refused"); got != "4" {
		t.Errorf("twill_leases_refused = %s, want 4", got)
	}
	out, _ := exec.Command("ip", "netns", "exec", ns, c.bin+"/twillctl", "status", "--etcd-endpoints", c.etcdURL,
		"--subnet-file", c.subnetFile(0), "--iface", "eth0").CombinedOutput()
	if !strings.Contains(string(out), "2 valid, 4 refused") || !strings.Contains(string(out), "224.0.0.1 is a multicast address") {
		t.Errorf("twillctl status on node1 (local %s):\n%s", local.Subnet, out)
	}
}

// TestSubnetEnvRewritten: subnet.env deleted or altered while twilld runs
// is written again, so new pods on the node do not fail until a restart.
func TestSubnetEnvRewritten(t *testing.T) {
	c := newCluster(t, 1)
	c.put("/twill.io/network/config", netConfHostGW)
	c.startDaemon(0)
	c.env(0)
	want, err := os.ReadFile(c.subnetFile(0))
	if err != nil {
		t.Fatal(err)
	}
	same := func() bool {
		got, err := os.ReadFile(c.subnetFile(0))
		return err == nil && string(got) == string(want)
	}
	if err := os.Remove(c.subnetFile(0)); err != nil {
		t.Fatal(err)
	}
	took := waitFor(t, 20*time.Second, "subnet.env written again after it was deleted", same)
	t.Logf("deleted subnet.env back after %s", took.Round(time.Millisecond))
	if err := os.WriteFile(c.subnetFile(0), []byte("TWILL_MTU=9000\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	took = waitFor(t, 20*time.Second, "subnet.env written again after it was altered", same)
	t.Logf("altered subnet.env back after %s", took.Round(time.Millisecond))
	// And a pod can be wired again.
	c.addPod(0, "after")
}
