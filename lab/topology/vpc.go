package topology

import (
	"fmt"
	"net/netip"

	"github.com/twill-net/twill/internal/sysctl"
	"github.com/twill-net/twill/lab/eni/sim"
)

// VPCOptions turn the underlay into a simulated cloud VPC for the eni
// backend (set Options.VPC).
type VPCOptions struct {
	// Space is the VPC's address space, from which prefixes are delegated
	// (it holds Underlay and ENISubnet too).
	Space netip.Prefix
	// ENISubnet is the subnet of the nodes' ENIs and their secondary IPs.
	ENISubnet netip.Prefix
	// MaxIPsPerENI is the per-ENI secondary IP limit (0: none).
	MaxIPsPerENI int
	// StateFile is where the sim provider's state is written.
	StateFile string
}

// buildVPC makes the underlay namespace a VPC router ("fabric"): one
// point-to-point port per NIC, the gateways on its loopback, proxy ARP on
// every port, a /32 route per NIC address, and strict rp_filter, the
// cloud's source/destination check. Each node gets eth0 (its primary NIC,
// on Underlay, default route via the fabric) and eth1 (its ENI, on
// ENISubnet). The sim provider's state file describes the ENIs.
func (t *Topology) buildVPC(o Options) error {
	v := o.VPC
	if !v.Space.Contains(o.Underlay.Addr()) || !v.Space.Contains(v.ENISubnet.Addr()) || v.ENISubnet.Overlaps(o.Underlay) {
		return fmt.Errorf("topology: VPC %s must hold the primary subnet %s and the ENI subnet %s, apart", v.Space, o.Underlay, v.ENISubnet)
	}
	fab := t.Underlay
	gwPrimary, gwENI := lastUsable(o.Underlay), lastUsable(v.ENISubnet)
	t.BridgeAddr = gwPrimary
	for _, s := range [][]string{
		{"addr", "add", gwPrimary.String() + "/32", "dev", "lo"},
		{"addr", "add", gwENI.String() + "/32", "dev", "lo"},
	} {
		if err := IP(fab, s...); err != nil {
			return err
		}
	}
	for _, name := range []string{"net/ipv4/ip_forward", "net/ipv4/conf/all/rp_filter", "net/ipv4/conf/default/rp_filter"} {
		if err := sysctl.SetIn("/var/run/netns/"+fab, name, "1"); err != nil {
			return err
		}
	}
	st := sim.State{Fabric: fab, VPC: v.Space, Subnet: v.ENISubnet, Gateway: gwENI, MaxIPsPerENI: v.MaxIPsPerENI}
	nextPrimary, nextENI := o.Underlay.Addr(), v.ENISubnet.Addr()
	for i := 1; i <= o.Nodes; i++ {
		nextPrimary, nextENI = nextPrimary.Next(), nextENI.Next()
		n := Node{Name: fmt.Sprintf("node%d", i), NS: fmt.Sprintf("%s-n%d", o.Prefix, i),
			Addr: netip.PrefixFrom(nextPrimary, o.Underlay.Bits()), ENIAddr: netip.PrefixFrom(nextENI, v.ENISubnet.Bits())}
		if err := t.addNS(n.NS); err != nil {
			return err
		}
		pPort, ePort := fmt.Sprintf("p%d", i), fmt.Sprintf("e%d", i)
		for _, s := range []struct {
			ns   string
			args []string
		}{
			{n.NS, []string{"link", "add", "eth0", "type", "veth", "peer", "name", pPort, "netns", fab}},
			{n.NS, []string{"link", "add", "eth1", "type", "veth", "peer", "name", ePort, "netns", fab}},
			{n.NS, []string{"addr", "add", n.Addr.String(), "dev", "eth0"}},
			{n.NS, []string{"link", "set", "eth0", "up"}},
			{n.NS, []string{"link", "set", "eth1", "up"}},
			{n.NS, []string{"route", "add", "default", "via", gwPrimary.String(), "dev", "eth0"}},
			{fab, []string{"link", "set", pPort, "up"}},
			{fab, []string{"link", "set", ePort, "up"}},
			{fab, []string{"route", "add", nextPrimary.String() + "/32", "dev", pPort}},
			{fab, []string{"route", "add", nextENI.String() + "/32", "dev", ePort}},
		} {
			if err := IP(s.ns, s.args...); err != nil {
				return err
			}
		}
		for _, port := range []string{pPort, ePort} {
			for _, name := range []string{"proxy_arp", "rp_filter"} {
				if err := sysctl.SetIn("/var/run/netns/"+fab, "net/ipv4/conf/"+port+"/"+name, "1"); err != nil {
					return err
				}
			}
		}
		mac, err := linkMAC(n.NS, "eth1")
		if err != nil {
			return err
		}
		n.ENIMAC = mac
		st.ENIs = append(st.ENIs, sim.ENI{ID: fmt.Sprintf("eni-%d", i), MAC: mac, PrimaryIP: n.ENIAddr, Port: ePort})
		t.Nodes = append(t.Nodes, n)
	}
	return sim.Create(v.StateFile, st)
}
