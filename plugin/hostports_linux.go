package plugin

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"

	"github.com/containernetworking/cni/pkg/skel"
	"golang.org/x/sys/unix"

	"github.com/twill-net/twill/internal/sysctl"
	"github.com/twill-net/twill/nl"
	"github.com/twill-net/twill/nl/nft"
	"github.com/twill-net/twill/plugin/hostport"
)

// addHostPorts serves the pod's hostPorts (runtimeConfig.portMappings,
// when the conflist declares the capability) and pushes their removal.
// UDP flows to those ports that conntrack still sends elsewhere (to the
// pod that had the port before) are forgotten, so they reach this one.
// A port bound to 127.0.0.0/8 also has the pod's host veth route
// loopback addresses (route_localnet): a connection from 127.0.0.1 to it
// leaves, and its replies come back, through the veth.
func addHostPorts(c *NetConf, w Wiring, undo *undoStack) error {
	if len(c.HostPorts) == 0 {
		return nil
	}
	for _, p := range c.HostPorts {
		if p.HostIP.Is4() && p.HostIP.IsLoopback() {
			if err := sysctl.Set("net/ipv4/conf/"+w.HostVeth+"/route_localnet", "1"); err != nil {
				return fmt.Errorf("twill: host port %s: %w", p, err)
			}
			break
		}
	}
	if err := hostport.Add(nft.Conn{}, w.HostVeth, w.IPs, c.HostPorts); err != nil {
		return fmt.Errorf("twill: %w", err)
	}
	undo.push(func() { _, _ = hostport.Remove(nft.Conn{}, w.HostVeth) })
	var udp []uint16
	for _, p := range c.HostPorts {
		if p.Proto == unix.IPPROTO_UDP {
			udp = append(udp, p.HostPort)
		}
	}
	if _, err := nl.ForgetUDPToPorts(udp...); err != nil {
		return fmt.Errorf("twill: host ports: %w", err)
	}
	return nil
}

// delHostPorts removes the attachment's host ports. An attachment with
// port mappings and none of twill's rules was wired while portmap was
// chained after twill (before the conflist served the capability itself,
// or on a node switched from flannel): portmap's own DEL removes its rules,
// when portmap is installed.
func delHostPorts(args *skel.CmdArgs, c *NetConf) error {
	had, err := hostport.Remove(nft.Conn{}, HostVethName(args.ContainerID, args.IfName))
	if err != nil {
		return fmt.Errorf("twill: %w", err)
	}
	if had || len(c.HostPorts) == 0 {
		return nil
	}
	if _, err := findPlugin("portmap", filepath.SplitList(os.Getenv("CNI_PATH"))); err != nil {
		return nil // not installed: it made no rules either
	}
	conf, err := json.Marshal(map[string]any{
		"cniVersion": "1.0.0", // what every portmap since 1.0 reads
		"name":       c.Name, "type": "portmap",
		"runtimeConfig": map[string]json.RawMessage{"portMappings": c.PortMappings},
	})
	if err != nil {
		return fmt.Errorf("twill: %w", err)
	}
	if _, err := delegate(context.Background(), "DEL", "portmap", conf); err != nil {
		return fmt.Errorf("twill: removing the host ports portmap wired for %s: %w", args.ContainerID, err)
	}
	return nil
}

// checkHostPorts verifies the pod's host ports.
func checkHostPorts(c *NetConf, w Wiring, ips []netip.Addr) error {
	if len(c.HostPorts) == 0 {
		return nil
	}
	if err := hostport.Check(nft.Conn{}, w.HostVeth, ips, c.HostPorts); err != nil {
		return fmt.Errorf("twill: CHECK: %w", err)
	}
	return nil
}

// pruneHostPorts removes the host ports of attachments whose host veth is
// gone, of this network or any other.
func pruneHostPorts(host *nl.Handle) error {
	var errs []error
	_, err := hostport.Prune(nft.Conn{}, func(owner string) bool {
		exists, err := host.LinkExists(owner)
		if err != nil {
			errs = append(errs, err)
			return false
		}
		return !exists
	})
	if err != nil {
		return fmt.Errorf("twill: %w", err)
	}
	if len(errs) > 0 {
		return fmt.Errorf("twill: collecting host ports: %w", errs[0])
	}
	return nil
}
