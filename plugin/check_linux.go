package plugin

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"

	"github.com/containernetworking/cni/pkg/skel"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/cni/pkg/version"

	"github.com/twill-net/twill/nl"
	"github.com/twill-net/twill/subnet"
)

// cmdCheck verifies that the kernel holds the wiring of the addresses
// prevResult names, and names the first thing missing.
func cmdCheck(args *skel.CmdArgs, c *NetConf) error {
	if c.hostPortsErr != nil {
		return c.hostPortsErr
	}
	prev, err := prevResult(c)
	if err != nil {
		return err
	}
	var em *eniMode
	if env, err := subnet.ReadEnv(c.SubnetFile); err == nil { // only its eni settings matter here
		if m, isENI, _ := eniFromEnv(env); isENI {
			em = &m
		}
	}
	var ips []netip.Addr
	for _, ipc := range prev.IPs {
		a, _ := netip.AddrFromSlice(ipc.Address.IP)
		ips = append(ips, a.Unmap())
	}
	w := newWiring(args.ContainerID, args.IfName, 0, ips, em)
	err = withHandles(args.Netns, func(pod, host *nl.Handle) error {
		if err := w.verify(pod, host, prev, args.Netns); err != nil {
			return fmt.Errorf("twill: CHECK: %w", err)
		}
		if err := checkAntiSpoof(w); err != nil {
			return err
		}
		return checkHostPorts(c, w, ips)
	})
	if err != nil {
		return err
	}
	if c.IPAM.Type != "" {
		if _, err := delegate(context.Background(), "CHECK", c.IPAM.Type, args.StdinData); err != nil {
			return fmt.Errorf("twill: delegated IPAM %q: %w", c.IPAM.Type, err)
		}
	}
	return nil
}

func prevResult(c *NetConf) (*current.Result, error) {
	if c.RawPrevResult == nil {
		return nil, fmt.Errorf("twill: CHECK needs prevResult")
	}
	if err := version.ParsePrevResult(&c.NetConf); err != nil {
		return nil, fmt.Errorf("twill: parsing prevResult: %w", err)
	}
	prev, err := current.NewResultFromResult(c.PrevResult)
	if err != nil {
		return nil, fmt.Errorf("twill: converting prevResult: %w", err)
	}
	return prev, nil
}

// verify compares the kernel with the wiring: the links, then every object
// of the pod end and of the host end.
func (w Wiring) verify(pod, host *nl.Handle, prev *current.Result, netns string) error {
	hostLink, err := host.LinkByName(w.HostVeth)
	if err != nil {
		return fmt.Errorf("host veth %s: %w", w.HostVeth, err)
	}
	if !hostLink.Up {
		return fmt.Errorf("host veth %s is down", w.HostVeth)
	}
	podLink, err := pod.LinkByName(w.IfName)
	if err != nil {
		return fmt.Errorf("interface %s in %s: %w", w.IfName, netns, err)
	}
	for _, iface := range prev.Interfaces {
		have := net.HardwareAddr(podLink.HardwareAddr).String()
		if iface.Sandbox != "" && iface.Name == w.IfName && iface.Mac != "" && !strings.EqualFold(iface.Mac, have) {
			return fmt.Errorf("%s has MAC %s, prevResult says %s", w.IfName, have, iface.Mac)
		}
	}
	if err := w.verifyPod(pod, podLink, hostLink.HardwareAddr, netns); err != nil {
		return err
	}
	return w.verifyHost(host, hostLink)
}

func (w Wiring) verifyPod(pod *nl.Handle, podLink nl.Link, hostMAC []byte, netns string) error {
	want := w.Pod(podLink.Index, hostMAC)
	addrs, err := pod.Addrs(podLink.Index, nl.FamilyAll)
	if err != nil {
		return err
	}
	routes, err := pod.Routes(nl.FamilyAll, nl.RouteFilter{LinkIndex: podLink.Index})
	if err != nil {
		return err
	}
	neighs, err := pod.Neighs(podLink.Index, nl.FamilyAll)
	if err != nil {
		return err
	}
	for _, a := range want.Addrs {
		if !slices.ContainsFunc(addrs, func(h nl.Addr) bool { return h.Prefix.Addr() == a.Prefix.Addr() }) {
			return fmt.Errorf("%s missing in %s", describeAddr(a, w.IfName), netns)
		}
	}
	for _, r := range want.Routes {
		if !slices.ContainsFunc(routes, func(h nl.Route) bool { return h.Dst == r.Dst && h.Gw == r.Gw }) {
			return fmt.Errorf("%s missing in %s", describeRoute(r, w.IfName), netns)
		}
	}
	for _, n := range want.Neighs {
		if !slices.ContainsFunc(neighs, func(h nl.Neigh) bool {
			return h.IP == n.IP && h.Permanent && bytes.Equal(h.HardwareAddr, n.HardwareAddr)
		}) {
			return fmt.Errorf("%s missing in %s", describeNeigh(n, w.IfName), netns)
		}
	}
	return nil
}

func (w Wiring) verifyHost(host *nl.Handle, hostLink nl.Link) error {
	want := w.Host(hostLink.Index)
	routes, err := host.Routes(nl.FamilyAll, nl.RouteFilter{LinkIndex: hostLink.Index, Protocol: nl.PodRouteProtocol})
	if err != nil {
		return err
	}
	for _, r := range want.Routes {
		if !slices.ContainsFunc(routes, func(h nl.Route) bool { return h.Dst == r.Dst }) {
			return fmt.Errorf("host %s missing", describeRoute(r, w.HostVeth))
		}
	}
	if len(want.Rules) == 0 {
		return nil
	}
	rules, err := host.Rules(nl.FamilyV4)
	if err != nil {
		return err
	}
	for _, r := range want.Rules {
		if !slices.ContainsFunc(rules, r.Same) {
			return fmt.Errorf("%s missing (eni backend)", describeRule(r))
		}
	}
	return nil
}
