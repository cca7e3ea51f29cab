package e2e

import (
	"strings"
	"testing"
	"time"
)

// TestEtcdHostGWPods: pods wired by the twill CNI plugin on different nodes
// of a host-gw cluster talk TCP both ways, reach peer nodes, and are
// reachable from them.
func TestEtcdHostGWPods(t *testing.T) {
	beside(t)
	c := newCluster(t, 3)
	c.put("/twill.io/network/config", netConfHostGW)
	for i := range c.topo.Nodes {
		c.startDaemon(i)
	}
	subnets := []string{c.env(0).Subnet.String(), c.env(1).Subnet.String(), c.env(2).Subnet.String()}
	waitFor(t, 5*time.Second, "routes between all nodes", func() bool {
		for i := range 3 {
			for j := range 3 {
				if i != j && !strings.Contains(c.routes(i), subnets[j]) {
					return false
				}
			}
		}
		return true
	})
	p1, ip1 := c.addPod(0, "p1")
	p3, ip3 := c.addPod(2, "p3")

	t.Run("TCP pod on node1 to pod on node3", func(t *testing.T) { c.tcp(p3, ip3, p1) })
	t.Run("TCP pod on node3 to pod on node1", func(t *testing.T) { c.tcp(p1, ip1, p3) })
	t.Run("pod reaches a peer node", func(t *testing.T) {
		if err := ping(p1, c.topo.Nodes[1].Addr.Addr()); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("node reaches a remote pod", func(t *testing.T) {
		if err := ping(c.topo.Nodes[2].NS, ip1); err != nil {
			t.Fatal(err)
		}
	})
}
