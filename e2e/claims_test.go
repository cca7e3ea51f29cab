package e2e

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"

	"github.com/twill-net/twill/subnet"
)

// TestCopiedClaimsRefused: a client holding a node's etcd credentials
// writes two leases for subnets below every node's: one copies node2's
// backend data (its VTEP MAC, or its WireGuard public key) at an unused
// public IP, the other claims node2's public IP. The copies are younger
// than node2's lease, so every node refuses them and node2 keeps talking
// to every peer: while the copies arrive, and after node1's twilld
// restarts and meets them all in one listing. Each node's log names what
// each copy was refused for.
func TestCopiedClaimsRefused(t *testing.T) {
	for _, be := range []string{"vxlan", "wireguard"} {
		t.Run(be, func(t *testing.T) {
			beside(t)
			c := newCluster(t, 3)
			if be == "wireguard" {
				t.Cleanup(c.stopWireGuardDevices)
			}
			// The nodes take subnets from 10.244.10.0 up: the copies'
			// subnets sort before every node's.
			c.put("/twill.io/network/config", fmt.Sprintf(`{"Network":"10.244.0.0/16","SubnetMin":"10.244.10.0","SubnetMax":"10.244.199.0","Backend":{"Type":%q}}`, be))
			for i := range c.topo.Nodes {
				c.startDaemon(i)
			}
			cc := newCopyCheck(t, c, "c")

			victim := c.env(1).Subnet
			resp, err := c.cli.Get(context.Background(), "/twill.io/network/subnets/"+subnet.SubnetKey(victim, netip.Prefix{}))
			if err != nil || len(resp.Kvs) != 1 {
				t.Fatalf("reading node2's lease: %v", err)
			}
			attrs, err := subnet.ParseLeaseAttrs(resp.Kvs[0].Value)
			if err != nil {
				t.Fatal(err)
			}
			own := `{"VNI":1,"VtepMAC":"0a:dd:00:00:00:01"}`
			if be == "wireguard" {
				k, err := wgtypes.GeneratePrivateKey()
				if err != nil {
					t.Fatal(err)
				}
				own = fmt.Sprintf(`{"PublicKey":%q}`, k.PublicKey())
			}
			copies := map[string]string{
				"10.244.1.0/24": fmt.Sprintf(`{"PublicIP":"10.99.0.201","BackendType":%q,"BackendData":%s}`, be, attrs.BackendData),
				"10.244.2.0/24": fmt.Sprintf(`{"PublicIP":%q,"BackendType":%q,"BackendData":%s}`, c.topo.Nodes[1].Addr.Addr(), be, own),
			}
			why := map[string]string{
				"10.244.1.0/24": map[string]string{"vxlan": "VTEP MAC", "wireguard": "WireGuard public key"}[be],
				"10.244.2.0/24": "public IP " + c.topo.Nodes[1].Addr.Addr().String() + " is held by",
			}
			for sub, v := range copies {
				c.put("/twill.io/network/subnets/"+strings.Replace(sub, "/", "-", 1), v)
			}
			cc.why = why
			cc.hold(t, "with the copies in etcd")

			// node1 lists the copies and node2's lease at once.
			c.daemons[0].Stop(t)
			c.startDaemon(0)
			cc.hold(t, "after node1's restart")
		})
	}
}

// logNames reports whether out names the lease sub and says why in one
// line, or in one of the "; "-separated peers of a refusal's line.
func logNames(out, sub, why string) bool {
	for _, line := range strings.Split(out, "\n") {
		for _, part := range strings.Split(line, "; ") {
			if strings.Contains(part, sub) && strings.Contains(part, why) {
				return true
			}
		}
	}
	return false
}

// TestKubeCopiedClaimsRefused is TestCopiedClaimsRefused in Kubernetes
// mode: two Nodes registered after the others (a compromised node writes
// the same into its own Node's annotations, which the admission policy
// lets it) copy node2's backend data at an address of their own, and
// node2's public IP with backend data of their own. The copies are the
// younger Nodes: every node refuses them, node2 keeps talking to every
// peer, also after node1's twilld restarts and meets them all in one
// listing.
func TestKubeCopiedClaimsRefused(t *testing.T) {
	for _, be := range []string{"vxlan", "wireguard"} {
		t.Run(be, func(t *testing.T) {
			beside(t)
			k := newKubeCluster(t, 3, be)
			if be == "wireguard" {
				t.Cleanup(k.stopWireGuardDevices)
			}
			k.startNodes()
			cc := newCopyCheck(t, k.cluster, "k")

			victim := k.published(1)
			own := `{"VNI":1,"VtepMAC":"0a:dd:00:00:00:02"}`
			if be == "wireguard" {
				key, err := wgtypes.GeneratePrivateKey()
				if err != nil {
					t.Fatal(err)
				}
				own = fmt.Sprintf(`{"PublicKey":%q}`, key.PublicKey())
			}
			// A Node's creationTimestamp has a second's resolution: the
			// copies are a second younger than node3 at least.
			time.Sleep(1100 * time.Millisecond)
			node2 := k.topo.Nodes[1].Addr.Addr()
			spare := netip.MustParseAddr("10.99.0.201")
			k.createNode("copy-data", "10.244.100.0/24", spare, map[string]string{
				"twill.io/backend-type": be, "twill.io/backend-data": victim["twill.io/backend-data"], "twill.io/public-ip": spare.String()})
			k.createNode("copy-ip", "10.244.0.0/24", node2, map[string]string{
				"twill.io/backend-type": be, "twill.io/backend-data": own, "twill.io/public-ip": node2.String()})
			why := map[string]string{
				"10.244.100.0/24": map[string]string{"vxlan": "VTEP MAC", "wireguard": "WireGuard public key"}[be],
				"10.244.0.0/24":   "public IP " + node2.String() + " is held by",
			}
			cc.why = why
			cc.hold(t, "with the copies registered")
			k.daemons[0].Stop(t)
			k.startKubeDaemon(0)
			cc.hold(t, "after node1's restart")
		})
	}
}

// copyCheck is what TestCopiedClaimsRefused and TestKubeCopiedClaimsRefused
// hold a cluster to: a pod per node, every pair talking, and the copies'
// subnets (why: what each one's refusal says) refused by every node.
type copyCheck struct {
	c     *cluster
	pods  []string
	addrs []netip.Addr
	why   map[string]string
}

// newCopyCheck adds a pod to each node (named prefix<i>) and waits until
// every pair talks.
func newCopyCheck(t *testing.T, c *cluster, prefix string) *copyCheck {
	t.Helper()
	cc := &copyCheck{c: c}
	for i := range c.topo.Nodes {
		p, a := c.addPod(i, fmt.Sprintf("%s%d", prefix, i))
		cc.pods, cc.addrs = append(cc.pods, p), append(cc.addrs, a)
	}
	waitFor(t, 30*time.Second, "pods on every pair of nodes talking", func() bool { return cc.broken() == "" })
	return cc
}

// broken names the first pair of nodes whose pods cannot talk, or "".
func (cc *copyCheck) broken() string {
	for i := range cc.pods {
		for j := range cc.pods {
			if i != j && ping(cc.pods[i], cc.addrs[j]) != nil {
				return fmt.Sprintf("node%d to node%d", i+1, j+1)
			}
		}
	}
	return ""
}

// refusedBy says which copy node i's twilld (the process running now: a
// restarted one's former self does not count) has not refused for its
// reason, or "".
func (cc *copyCheck) refusedBy(i int) string {
	out := cc.c.daemons[i].OwnOutput()
	for sub, w := range cc.why {
		if !logNames(out, sub, w) {
			return fmt.Sprintf("node%d's log never refuses %s for %q", i+1, sub, w)
		}
	}
	return ""
}

// hold waits for every pair to talk and every node to refuse every copy,
// then checks that the pairs keep talking over a few rounds (a refusal of
// node2 would show within one reconcile) and that no node routes a copy.
func (cc *copyCheck) hold(t *testing.T, when string) {
	t.Helper()
	waitFor(t, 30*time.Second, when+": pods on every pair of nodes talking", func() bool { return cc.broken() == "" })
	for i := range cc.c.topo.Nodes {
		waitFor(t, 20*time.Second, fmt.Sprintf("%s: node%d refusing every copy", when, i+1), func() bool { return cc.refusedBy(i) == "" })
	}
	for round := range 5 {
		if b := cc.broken(); b != "" {
			t.Fatalf("%s, round %d: pods from %s cannot talk (node2 evicted by a copy of its lease?)", when, round+1, b)
		}
		time.Sleep(200 * time.Millisecond)
	}
	for i := range cc.c.topo.Nodes {
		routes := cc.c.routes(i)
		for sub := range cc.why {
			if strings.Contains(routes, sub) {
				t.Errorf("%s: node%d routes the copy %s:\n%s", when, i+1, sub, routes)
			}
		}
	}
}
