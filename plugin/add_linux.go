package plugin

import (
	"fmt"
	"net/netip"
	"slices"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"

	"github.com/twill-net/twill/internal/sysctl"
	"github.com/twill-net/twill/nl"
	"github.com/twill-net/twill/subnet"
	"github.com/twill-net/twill/takeover"
)

// undoStack holds the undo of every step taken; a failed ADD runs them in
// reverse, so it leaks no address, link, route or rule.
type undoStack []func()

func (u *undoStack) push(f func()) { *u = append(*u, f) }

func (u undoStack) run() {
	for i := len(u) - 1; i >= 0; i-- {
		u[i]()
	}
}

// addInput is what ADD reads before it changes anything.
type addInput struct {
	conf *NetConf
	env  subnet.Env
	eni  *eniMode // nil without the eni backend
	mtu  int
}

func readAddInput(args *skel.CmdArgs, c *NetConf) (addInput, error) {
	var in addInput
	if c.hostPortsErr != nil {
		return in, c.hostPortsErr
	}
	if err := CheckIfName(args.IfName); err != nil {
		return in, err
	}
	env, err := readEnv(c)
	if err != nil {
		return in, err
	}
	em, isENI, err := eniFromEnv(env)
	if err != nil {
		return in, err
	}
	in = addInput{conf: c, env: env, mtu: env.MTU}
	if isENI {
		in.eni = &em
	}
	if c.MTU > 0 {
		in.mtu = c.MTU
	}
	return in, nil
}

func cmdAdd(args *skel.CmdArgs, c *NetConf) error {
	in, err := readAddInput(args, c)
	if err != nil {
		return err
	}
	return withHandles(args.Netns, func(pod, host *nl.Handle) error { return add(in, args, pod, host) })
}

// add takes the pod's addresses and wires it, printing the result; on a
// failure it undoes each step it made.
func add(in addInput, args *skel.CmdArgs, pod, host *nl.Handle) (err error) {
	if err := refuseAttached(host, args); err != nil {
		return err
	}
	var undo undoStack
	defer func() {
		if err != nil {
			undo.run()
		}
	}()
	ips, ipamResult, err := allocateFor(in, args, host, &undo)
	if err != nil {
		return err
	}
	w := newWiring(args.ContainerID, args.IfName, in.mtu, ips, in.eni)
	hostLink, podLink, err := w.apply(pod, host, args.Netns, LinkAlias(in.conf.Name, args.ContainerID, args.IfName), &undo)
	if err != nil {
		return err
	}
	if err := addAntiSpoof(host, w, &undo); err != nil {
		return err
	}
	if err := addHostPorts(in.conf, w, &undo); err != nil {
		return err
	}
	result := w.Result(hostLink, podLink, args.Netns)
	if ipamResult != nil {
		result.DNS = ipamResult.DNS
	}
	return types.PrintResult(result, in.conf.CNIVersion)
}

// refuseAttached fails an ADD for an attachment that exists (its host
// interface does): the runtime must DEL it first (CNI forbids a second
// ADD), and going on would take a second address for it.
func refuseAttached(host *nl.Handle, args *skel.CmdArgs) error {
	name := HostVethName(args.ContainerID, args.IfName)
	exists, err := host.LinkExists(name)
	if err != nil {
		return fmt.Errorf("twill: %w", err)
	}
	if exists {
		return fmt.Errorf("twill: container %s already has %s on this network (host interface %s exists): a second ADD needs a DEL first", args.ContainerID, args.IfName, name)
	}
	return nil
}

// allocateFor takes the pod's addresses: from the eni warm pool in
// secondary-ip mode, else in process or through the configured IPAM.
func allocateFor(in addInput, args *skel.CmdArgs, host *nl.Handle, undo *undoStack) ([]netip.Addr, *current.Result, error) {
	c := in.conf
	if in.eni != nil && in.eni.Mode == eniModeSecondaryIP && c.IPAM.Type == "" {
		ip, err := allocateFromPool(in.eni.PoolDir, args.ContainerID, args.IfName)
		if err != nil {
			return nil, nil, err
		}
		undo.push(func() { _, _ = poolRelease(in.eni.PoolDir, args.ContainerID, args.IfName) })
		return []netip.Addr{ip}, nil, nil
	}
	ips, res, err := addAddresses(c, args, in.env, host.LinkExists)
	if err != nil {
		return nil, nil, err
	}
	undo.push(func() { _ = delAddresses(c, args, nil) })
	return ips, res, nil
}

// apply makes the wiring: the veth pair, then the pod end, then the host
// end, pushing the undo of each step.
func (w Wiring) apply(pod, host *nl.Handle, netns, alias string, undo *undoStack) (hostLink, podLink nl.Link, err error) {
	hostLink, err = host.VethAdd(w.HostVeth, w.IfName, netns, w.MTU, alias)
	if err != nil {
		return hostLink, podLink, fmt.Errorf("twill: %w", err)
	}
	undo.push(func() { _ = host.LinkDel(hostLink.Index) }) // takes the pod end and both ends' routes with it
	podLink, err = pod.LinkByName(w.IfName)
	if err != nil {
		return hostLink, podLink, fmt.Errorf("twill: pod side of %s: %w", w.HostVeth, err)
	}
	if err := pod.LinkSetUp(podLink.Index); err != nil {
		return hostLink, podLink, fmt.Errorf("twill: %w", err)
	}
	p := w.Pod(podLink.Index, hostLink.HardwareAddr)
	for _, a := range p.Addrs {
		if err := pod.AddrAdd(a.LinkIndex, a.Prefix); err != nil {
			return hostLink, podLink, fmt.Errorf("twill: wiring pod: %s: %w", describeAddr(a, w.IfName), err)
		}
	}
	for _, r := range p.Routes {
		if err := pod.RouteAdd(r); err != nil {
			return hostLink, podLink, fmt.Errorf("twill: wiring pod: %s: %w", describeRoute(r, w.IfName), err)
		}
	}
	for _, n := range p.Neighs {
		if err := pod.NeighSet(n); err != nil {
			return hostLink, podLink, fmt.Errorf("twill: wiring pod: %s: %w", describeNeigh(n, w.IfName), err)
		}
	}
	return hostLink, podLink, w.applyHost(host, hostLink, undo)
}

func (w Wiring) applyHost(host *nl.Handle, hostLink nl.Link, undo *undoStack) error {
	if err := host.LinkSetUp(hostLink.Index); err != nil {
		return fmt.Errorf("twill: %w", err)
	}
	h := w.Host(hostLink.Index)
	if err := sysctl.Set(h.ProxyARP, "1"); err != nil {
		return fmt.Errorf("twill: %w", err)
	}
	for _, r := range h.Routes {
		if err := host.RouteAdd(r); err != nil {
			return fmt.Errorf("twill: routing to the pod: %s: %w", describeRoute(r, w.HostVeth), err)
		}
	}
	if err := answerOnFlannelBridge(host, w.IPs); err != nil {
		return err
	}
	if len(h.Rules) > 0 {
		undo.push(func() { _ = deletePodRules(host, w.IPs) })
	}
	for _, r := range h.Rules {
		if err := host.RuleAdd(r); err != nil {
			return fmt.Errorf("twill: policy rule for the pod: %s: %w", describeRule(r), err)
		}
	}
	return nil
}

// answerOnFlannelBridge turns proxy ARP on on flannel's bridge, when the
// node was switched from flannel and pods remain on it: they see the
// node's whole subnet as on-link and ARP for this pod on the bridge, so
// the node must answer for it. twilld does the same, but in a container
// whose /proc/sys is read-only it cannot; the plugin runs on the node.
// Only a bridge whose subnet holds the pod is flannel's here.
func answerOnFlannelBridge(host *nl.Handle, ips []netip.Addr) error {
	l, err := host.LinkByName(takeover.DefaultBridge)
	if err != nil {
		return nil // none (another error: no bridge to answer on either)
	}
	ours, err := takeover.IsFlannelBridge(host, l, func(p netip.Prefix) bool {
		return slices.ContainsFunc(ips, p.Masked().Contains)
	})
	if err != nil {
		return fmt.Errorf("twill: %w", err)
	}
	if !ours {
		return nil
	}
	if err := sysctl.Set("net/ipv4/conf/"+takeover.DefaultBridge+"/proxy_arp", "1"); err != nil {
		return fmt.Errorf("twill: answering for the pod on flannel's bridge: %w", err)
	}
	return nil
}
