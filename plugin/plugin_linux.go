package plugin

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/cni/pkg/version"
	"github.com/containernetworking/plugins/pkg/ipam"

	eni "github.com/twill-net/twill/backend/eni/cni"
	"github.com/twill-net/twill/backend/nl"
	"github.com/twill-net/twill/backend/owned"
	"github.com/twill-net/twill/internal/allocations"
	"github.com/twill-net/twill/internal/sysctl"
	"github.com/twill-net/twill/subnet"
)

// Gateways the pod routes through: link-local, answered by the host veth.
var (
	GatewayV4 = netip.MustParseAddr("169.254.1.1")
	GatewayV6 = netip.MustParseAddr("fe80::1")
)

// Funcs are the plugin's verbs for skel.PluginMainFuncs.
func Funcs() skel.CNIFuncs {
	return skel.CNIFuncs{Add: cmdAdd, Del: cmdDel, Check: cmdCheck, Status: cmdStatus, GC: cmdGC}
}

// Versions the plugin speaks.
func Versions() version.PluginInfo {
	return version.PluginSupports("0.3.1", "0.4.0", "1.0.0", "1.1.0")
}

func readEnv(c *NetConf) (subnet.Env, error) {
	env, err := subnet.ReadEnv(c.SubnetFile)
	if errors.Is(err, subnet.ErrNoEnv) {
		return env, types.NewError(types.ErrTryAgainLater,
			fmt.Sprintf("twill: %s does not exist: the twill daemon has not written it yet", c.SubnetFile),
			"start twilld on this node (or set subnetFile in the network configuration)")
	}
	if err != nil {
		return env, fmt.Errorf("twill: %w", err)
	}
	return env, nil
}

// openHandles opens netlink handles on the pod's namespace and on the
// node's (the plugin's own).
func openHandles(netnsPath string) (pod, host *nl.Handle, err error) {
	pod, err = nl.OpenPath(netnsPath)
	if err != nil {
		return nil, nil, fmt.Errorf("twill: pod network namespace %q: %w", netnsPath, err)
	}
	host, err = nl.Open("")
	if err != nil {
		pod.Close()
		return nil, nil, fmt.Errorf("twill: %w", err)
	}
	return pod, host, nil
}

func hostPrefix(a netip.Addr) netip.Prefix { return netip.PrefixFrom(a, a.BitLen()) }

func cmdAdd(args *skel.CmdArgs) (err error) {
	c, err := ParseConf(args.StdinData)
	if err != nil {
		return err
	}
	if err := CheckIfName(args.IfName); err != nil {
		return err
	}
	env, err := readEnv(c)
	if err != nil {
		return err
	}
	em, isENI, err := eniFromEnv(env)
	if err != nil {
		return err
	}
	mtu := env.MTU
	if c.MTU > 0 {
		mtu = c.MTU
	}
	pod, host, err := openHandles(args.Netns)
	if err != nil {
		return err
	}
	defer pod.Close()
	defer host.Close()

	// Every step registers its undo; a failure runs them in reverse, so a
	// failed ADD leaks no address, link or route.
	var undo []func()
	defer func() {
		if err != nil {
			for i := len(undo) - 1; i >= 0; i-- {
				undo[i]()
			}
		}
	}()

	var (
		ips        []netip.Addr
		ipamResult *current.Result
	)
	if isENI && em.Mode == eniModeSecondaryIP && c.IPAM.Type == "" {
		ip, err := allocateFromPool(em.PoolDir, args.ContainerID, args.IfName)
		if err != nil {
			return err
		}
		ips = []netip.Addr{ip}
		undo = append(undo, func() { _, _ = poolRelease(em.PoolDir, args.ContainerID, args.IfName) })
	} else {
		ips, ipamResult, err = addAddresses(c, args, env, host)
		if err != nil {
			return err
		}
		undo = append(undo, func() { _ = delAddresses(c, args) })
	}

	hostName := HostVethName(args.ContainerID, args.IfName)
	hostLink, err := host.VethAdd(hostName, args.IfName, args.Netns, mtu, LinkAlias(c.Name, args.ContainerID, args.IfName))
	if err != nil {
		return fmt.Errorf("twill: %w", err)
	}
	undo = append(undo, func() { _ = host.LinkDel(hostLink.Index) })

	podLink, err := pod.LinkByName(args.IfName)
	if err != nil {
		return fmt.Errorf("twill: pod side of %s: %w", hostName, err)
	}
	if err := pod.LinkSetUp(podLink.Index); err != nil {
		return fmt.Errorf("twill: %w", err)
	}
	for _, ip := range ips {
		gw := GatewayV4
		if ip.Is6() {
			gw = GatewayV6
		}
		steps := []func() error{
			func() error { return pod.AddrAdd(podLink.Index, hostPrefix(ip)) },
			func() error {
				if gw.Is6() {
					return nil // fe80::1 is on-link through the link-local prefix
				}
				return pod.RouteAdd(nl.Route{Dst: hostPrefix(gw), LinkIndex: podLink.Index, Scope: nl.ScopeLink})
			},
			func() error {
				return pod.RouteAdd(nl.Route{Dst: netip.PrefixFrom(zero(ip), 0), Gw: gw, LinkIndex: podLink.Index})
			},
			func() error {
				return pod.NeighSet(nl.Neigh{LinkIndex: podLink.Index, IP: gw, HardwareAddr: hostLink.HardwareAddr, Permanent: true})
			},
		}
		for _, step := range steps {
			if err := step(); err != nil {
				return fmt.Errorf("twill: wiring pod %s: %w", ip, err)
			}
		}
	}
	if err := host.LinkSetUp(hostLink.Index); err != nil {
		return fmt.Errorf("twill: %w", err)
	}
	if err := sysctl.Set("net/ipv4/conf/"+hostName+"/proxy_arp", "1"); err != nil {
		return fmt.Errorf("twill: %w", err)
	}
	for _, ip := range ips {
		r := nl.Route{Dst: hostPrefix(ip), LinkIndex: hostLink.Index, Scope: nl.ScopeLink, Protocol: owned.PodRouteProtocol}
		if err := host.RouteAdd(r); err != nil {
			return fmt.Errorf("twill: routing to pod %s: %w", ip, err)
		}
	}
	if isENI {
		undo = append(undo, func() { _ = deletePodRules(host, ips) })
		for _, ip := range ips {
			if !ip.Is4() {
				continue
			}
			for _, rule := range em.podRules(ip) {
				if err := host.RuleAdd(rule); err != nil {
					return fmt.Errorf("twill: policy rule for pod %s: %w", ip, err)
				}
			}
		}
	}

	result := &current.Result{
		CNIVersion: current.ImplementedSpecVersion,
		Interfaces: []*current.Interface{
			{Name: hostName, Mac: net.HardwareAddr(hostLink.HardwareAddr).String()},
			{Name: args.IfName, Mac: net.HardwareAddr(podLink.HardwareAddr).String(), Sandbox: args.Netns, Mtu: mtu},
		},
	}
	for _, ip := range ips {
		gw := GatewayV4
		if ip.Is6() {
			gw = GatewayV6
		}
		idx := 1
		result.IPs = append(result.IPs, &current.IPConfig{Address: ipNet(hostPrefix(ip)), Gateway: gw.AsSlice(), Interface: &idx})
		result.Routes = append(result.Routes, &types.Route{Dst: ipNet(netip.PrefixFrom(zero(ip), 0)), GW: gw.AsSlice()})
	}
	if ipamResult != nil {
		result.DNS = ipamResult.DNS
	}
	return types.PrintResult(result, c.CNIVersion)
}

func zero(a netip.Addr) netip.Addr {
	if a.Is4() {
		return netip.IPv4Unspecified()
	}
	return netip.IPv6Unspecified()
}

func ipNet(p netip.Prefix) net.IPNet {
	return net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}

// addAddresses allocates the pod's addresses in process, or through the
// configured IPAM plugin.
func addAddresses(c *NetConf, args *skel.CmdArgs, env subnet.Env, host *nl.Handle) ([]netip.Addr, *current.Result, error) {
	if c.IPAM.Type != "" {
		r, err := ipam.ExecAdd(c.IPAM.Type, args.StdinData)
		if err != nil {
			return nil, nil, fmt.Errorf("twill: delegated IPAM %q: %w", c.IPAM.Type, err)
		}
		res, err := current.NewResultFromResult(r)
		if err != nil {
			_ = ipam.ExecDel(c.IPAM.Type, args.StdinData)
			return nil, nil, fmt.Errorf("twill: delegated IPAM %q result: %w", c.IPAM.Type, err)
		}
		var ips []netip.Addr
		for _, ipc := range res.IPs {
			a, _ := netip.AddrFromSlice(ipc.Address.IP)
			ips = append(ips, a.Unmap())
		}
		if len(ips) == 0 {
			_ = ipam.ExecDel(c.IPAM.Type, args.StdinData)
			return nil, nil, fmt.Errorf("twill: delegated IPAM %q returned no address", c.IPAM.Type)
		}
		return ips, res, nil
	}
	var subnets []netip.Prefix
	if env.Subnet.IsValid() {
		subnets = append(subnets, env.Subnet)
	}
	if env.IPv6Subnet.IsValid() {
		subnets = append(subnets, env.IPv6Subnet)
	}
	ips, err := allocate(c, args.ContainerID, args.IfName, host.LinkExists, subnets...)
	return ips, nil, err
}

func delAddresses(c *NetConf, args *skel.CmdArgs) error {
	if c.IPAM.Type != "" {
		if err := ipam.ExecDel(c.IPAM.Type, args.StdinData); err != nil {
			return fmt.Errorf("twill: delegated IPAM %q: %w", c.IPAM.Type, err)
		}
		return nil
	}
	return release(c, args.ContainerID, args.IfName)
}

// cmdDel removes the attachment. Everything missing counts as removed, and
// nothing here needs subnet.env or the pod's namespace, so DEL works with
// the daemon down and the pod gone.
func cmdDel(args *skel.CmdArgs) error {
	c, err := ParseConf(args.StdinData)
	if err != nil {
		return err
	}
	var errs []error
	host, err := nl.Open("")
	if err != nil {
		return fmt.Errorf("twill: %w", err)
	}
	defer host.Close()
	// The pod's addresses, for its policy rules (eni): from prevResult,
	// the allocation records and the warm pool, so that DEL finds them with
	// the daemon down and the pod gone.
	// An address another attachment holds now (a repeated DEL, after the
	// address was reused) keeps its rules: they are that pod's.
	ips := prevIPs(c)
	others := map[netip.Addr]bool{}
	note := func(res []reservation) {
		for _, rv := range res {
			if rv.ContainerID == args.ContainerID && rv.IfName == args.IfName {
				ips = append(ips, rv.IP)
			} else {
				others[rv.IP] = true
			}
		}
	}
	if res, err := reservations(c); err == nil {
		note(res)
	}
	var poolDir string
	if env, err := subnet.ReadEnv(c.SubnetFile); err == nil {
		if em, isENI, _ := eniFromEnv(env); isENI && em.PoolDir != "" {
			poolDir = em.PoolDir
			if res, err := allocations.Records(filepath.Join(poolDir, eni.PoolStoreName)); err == nil {
				note(res)
			}
		}
	}
	ips = slices.DeleteFunc(ips, func(ip netip.Addr) bool { return others[ip] })
	if err := deletePodRules(host, ips); err != nil {
		errs = append(errs, err)
	}
	if poolDir != "" {
		if _, err := poolRelease(poolDir, args.ContainerID, args.IfName); err != nil {
			errs = append(errs, err)
		}
	}
	// Deleting the host end deletes the pod end and both /32 routes.
	if l, err := host.LinkByName(HostVethName(args.ContainerID, args.IfName)); err == nil {
		if err := host.LinkDel(l.Index); err != nil {
			errs = append(errs, fmt.Errorf("twill: %w", err))
		}
	} else if !errors.Is(err, nl.ErrLinkNotFound) {
		errs = append(errs, fmt.Errorf("twill: %w", err))
	}
	if err := delAddresses(c, args); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

func cmdCheck(args *skel.CmdArgs) error {
	c, err := ParseConf(args.StdinData)
	if err != nil {
		return err
	}
	if c.RawPrevResult == nil {
		return fmt.Errorf("twill: CHECK needs prevResult")
	}
	if err := version.ParsePrevResult(&c.NetConf); err != nil {
		return fmt.Errorf("twill: parsing prevResult: %w", err)
	}
	prev, err := current.NewResultFromResult(c.PrevResult)
	if err != nil {
		return fmt.Errorf("twill: converting prevResult: %w", err)
	}
	pod, host, err := openHandles(args.Netns)
	if err != nil {
		return err
	}
	defer pod.Close()
	defer host.Close()
	env, _ := subnet.ReadEnv(c.SubnetFile) // only its eni settings matter here

	hostName := HostVethName(args.ContainerID, args.IfName)
	hostLink, err := host.LinkByName(hostName)
	if err != nil {
		return fmt.Errorf("twill: CHECK: host veth %s: %w", hostName, err)
	}
	if !hostLink.Up {
		return fmt.Errorf("twill: CHECK: host veth %s is down", hostName)
	}
	podLink, err := pod.LinkByName(args.IfName)
	if err != nil {
		return fmt.Errorf("twill: CHECK: interface %s in %s: %w", args.IfName, args.Netns, err)
	}
	for _, iface := range prev.Interfaces {
		if iface.Sandbox != "" && iface.Name == args.IfName && iface.Mac != "" && !strings.EqualFold(iface.Mac, net.HardwareAddr(podLink.HardwareAddr).String()) {
			return fmt.Errorf("twill: CHECK: %s has MAC %s, prevResult says %s", args.IfName, net.HardwareAddr(podLink.HardwareAddr), iface.Mac)
		}
	}
	addrs, err := pod.Addrs(podLink.Index, nl.FamilyAll)
	if err != nil {
		return fmt.Errorf("twill: CHECK: %w", err)
	}
	podRoutes, err := pod.Routes(nl.FamilyAll, nl.RouteFilter{LinkIndex: podLink.Index})
	if err != nil {
		return fmt.Errorf("twill: CHECK: %w", err)
	}
	hostRoutes, err := host.Routes(nl.FamilyAll, nl.RouteFilter{LinkIndex: hostLink.Index, Protocol: owned.PodRouteProtocol})
	if err != nil {
		return fmt.Errorf("twill: CHECK: %w", err)
	}
	neighs, err := pod.Neighs(podLink.Index, nl.FamilyAll)
	if err != nil {
		return fmt.Errorf("twill: CHECK: %w", err)
	}
	hasRoute := func(rs []nl.Route, dst netip.Prefix, gw netip.Addr) bool {
		for _, r := range rs {
			if r.Dst == dst && r.Gw == gw {
				return true
			}
		}
		return false
	}
	for _, ipc := range prev.IPs {
		a, _ := netip.AddrFromSlice(ipc.Address.IP)
		ip := a.Unmap()
		found := false
		for _, ad := range addrs {
			found = found || ad.Prefix.Addr() == ip
		}
		if !found {
			return fmt.Errorf("twill: CHECK: address %s missing from %s in %s", ip, args.IfName, args.Netns)
		}
		gw := GatewayV4
		if ip.Is6() {
			gw = GatewayV6
		} else if !hasRoute(podRoutes, hostPrefix(gw), netip.Addr{}) {
			return fmt.Errorf("twill: CHECK: route %s dev %s scope link missing in %s", gw, args.IfName, args.Netns)
		}
		if !hasRoute(podRoutes, netip.PrefixFrom(zero(ip), 0), gw) {
			return fmt.Errorf("twill: CHECK: route default via %s dev %s missing in %s", gw, args.IfName, args.Netns)
		}
		neighOK := false
		for _, n := range neighs {
			neighOK = neighOK || (n.IP == gw && n.Permanent && bytes.Equal(n.HardwareAddr, hostLink.HardwareAddr))
		}
		if !neighOK {
			return fmt.Errorf("twill: CHECK: permanent neighbour %s lladdr %s missing on %s in %s", gw, net.HardwareAddr(hostLink.HardwareAddr), args.IfName, args.Netns)
		}
		if !hasRoute(hostRoutes, hostPrefix(ip), netip.Addr{}) {
			return fmt.Errorf("twill: CHECK: host route %s dev %s missing", hostPrefix(ip), hostName)
		}
		if em, isENI, _ := eniFromEnv(env); isENI && ip.Is4() {
			if err := checkPodRules(host, em, ip); err != nil {
				return err
			}
		}
	}
	if c.IPAM.Type != "" {
		if err := ipam.ExecCheck(c.IPAM.Type, args.StdinData); err != nil {
			return fmt.Errorf("twill: delegated IPAM %q: %w", c.IPAM.Type, err)
		}
	}
	return nil
}

// cmdStatus reports whether ADD can succeed: 50 (plugin not available) when
// the daemon has not written subnet.env or when the pool has no free address.
func cmdStatus(args *skel.CmdArgs) error {
	c, err := ParseConf(args.StdinData)
	if err != nil {
		return err
	}
	env, err := subnet.ReadEnv(c.SubnetFile)
	if err != nil {
		return types.NewError(types.ErrPluginNotAvailable, fmt.Sprintf("twill: not ready: %v", err), "")
	}
	if c.IPAM.Type != "" || !env.Subnet.IsValid() {
		return nil
	}
	if em, isENI, err := eniFromEnv(env); isENI && em.Mode == eniModeSecondaryIP {
		if err != nil {
			return types.NewError(types.ErrPluginNotAvailable, err.Error(), "")
		}
		return poolStatus(em.PoolDir)
	}
	rs, err := rangeSet(env.Subnet)
	if err != nil {
		return err
	}
	r := (*rs)[0]
	capacity := rangeSize(r.RangeStart, r.RangeEnd)
	if r.Gateway != nil && r.Contains(r.Gateway) {
		capacity--
	}
	res, err := reservations(c)
	if err != nil {
		return err
	}
	used := 0
	for _, rv := range res {
		if env.Subnet.Contains(rv.IP) {
			used++
		}
	}
	if used >= capacity {
		return types.NewError(types.ErrPluginNotAvailable,
			fmt.Sprintf("twill: no free address in %s (%d of %d in use)", env.Subnet, used, capacity), "")
	}
	return nil
}

func rangeSize(start, end net.IP) int {
	a, _ := netip.AddrFromSlice(start)
	b, _ := netip.AddrFromSlice(end)
	n := 0
	for x := a.Unmap(); x.IsValid() && !b.Unmap().Less(x) && n < 1<<24; x = x.Next() {
		n++
	}
	return n
}

// cmdGC removes allocations and host veths of attachments the runtime no
// longer has (cni.dev/valid-attachments).
func cmdGC(args *skel.CmdArgs) error {
	c, err := ParseConf(args.StdinData)
	if err != nil {
		return err
	}
	valid := map[types.GCAttachment]bool{}
	for _, a := range c.ValidAttachments {
		valid[a] = true
	}
	var (
		errs  []error
		stale []reservation
	)
	if c.IPAM.Type == "" {
		s, err := store(c)
		if err != nil {
			return err
		}
		if err := s.Lock(); err != nil {
			s.Close()
			return fmt.Errorf("twill: locking allocation store: %w", err)
		}
		defer func() { s.Unlock(); s.Close() }()
		res, err := reservations(c)
		if err != nil {
			errs = append(errs, err)
		}
		for _, rv := range res {
			if !valid[types.GCAttachment{ContainerID: rv.ContainerID, IfName: rv.IfName}] {
				stale = append(stale, rv)
			}
		}
	}
	host, err := nl.Open("")
	if err != nil {
		return fmt.Errorf("twill: %w", err)
	}
	defer host.Close()
	if env, err := subnet.ReadEnv(c.SubnetFile); err == nil {
		if em, isENI, _ := eniFromEnv(env); isENI && em.PoolDir != "" {
			poolStale, err := poolStale(em.PoolDir, valid)
			if err != nil {
				errs = append(errs, err)
			}
			stale = append(stale, poolStale...)
		}
	}
	var staleIPs []netip.Addr
	for _, rv := range stale {
		staleIPs = append(staleIPs, rv.IP)
	}
	if err := deletePodRules(host, staleIPs); err != nil {
		errs = append(errs, err)
	}
	// An allocation is recorded before its veth exists, and the veth's
	// name follows from the record: this finds the veth of an ADD killed
	// before it could label the link with its alias.
	for _, rv := range stale {
		if l, err := host.LinkByName(HostVethName(rv.ContainerID, rv.IfName)); err == nil {
			if err := host.LinkDel(l.Index); err != nil {
				errs = append(errs, fmt.Errorf("twill: %w", err))
			}
		}
		if err := os.Remove(rv.Path); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, fmt.Errorf("twill: releasing %s: %w", rv.IP, err))
		}
	}

	links, err := host.Links()
	if err != nil {
		return errors.Join(append(errs, fmt.Errorf("twill: %w", err))...)
	}
	for _, l := range links {
		att, ok := ParseLinkAlias(c.Name, l.Alias)
		if !ok || valid[att] {
			continue
		}
		if err := host.LinkDel(l.Index); err != nil {
			errs = append(errs, fmt.Errorf("twill: %w", err))
		}
	}
	return errors.Join(errs...)
}
