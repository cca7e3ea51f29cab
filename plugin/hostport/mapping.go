// Package hostport serves CNI's portMappings capability (Kubernetes'
// hostPort) from twill's own nftables table, so that no portmap plugin is
// exec'd after twill for every pod.
//
// The table is inet twill-hostport:
//
//	prerouting  nat hook, priority dstnat: fib daddr type local jump hostports
//	output      nat hook, priority dstnat: loopback goto loopback, then the same jump
//	postrouting nat hook, priority srcnat: ct status dnat jump hairpin;
//	            ct status dnat, saddr 127.0.0.0/8 masquerade
//	hostports   a pod's DNAT rules, one per mapping and address family
//	loopback    a pod's DNAT rules for mappings bound to 127.0.0.0/8 or ::1
//	hairpin     a pod's masquerade for its own traffic to its own host port
//
// A pod's rules carry its owner (the host end of its veth) in their
// comment; they are added in one transaction and deleted by handle in
// another, so pods never touch each other's rules and no lock is needed.
// The base chains are written, flushed and whole, in the transaction of
// the first pod's rules (or of any pod's, when they are not as twill
// writes them), which leaves exactly one copy of them.
package hostport

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"strings"

	"github.com/twill-net/twill/internal/strictjson"
)

// Mapping is one entry of runtimeConfig.portMappings, as runtimes send it
// (containerd, CRI-O: hostPort, containerPort, protocol, hostIP).
type Mapping struct {
	HostPort      int    `json:"hostPort"`
	ContainerPort int    `json:"containerPort"`
	Protocol      string `json:"protocol"`
	HostIP        string `json:"hostIP"`
}

// Port is a mapping checked and normalised: its protocol's number, and
// its host address (invalid for every local address of both families;
// 0.0.0.0 or :: for every one of that family).
type Port struct {
	HostPort, ContainerPort uint16
	Proto                   uint8
	HostIP                  netip.Addr
}

// protocols are the transport protocols a mapping may name.
var protocols = map[string]uint8{"tcp": 6, "udp": 17, "sctp": 132}

// Parse reads runtimeConfig.portMappings. Every error names the entry, the
// field and the value; nothing is taken from a list with an error in it.
func Parse(raw json.RawMessage) ([]Port, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return nil, nil
	}
	var items []json.RawMessage
	if err := json.Unmarshal(raw, &items); err != nil {
		return nil, fmt.Errorf("runtimeConfig.portMappings %q: must be a list", strictjson.Shown(raw))
	}
	out := make([]Port, 0, len(items))
	for i, item := range items {
		where := fmt.Sprintf("runtimeConfig.portMappings[%d].", i)
		var m Mapping
		if err := strictjson.Decode(item, &m, where); err != nil {
			return nil, err
		}
		p, err := m.check(where)
		if err != nil {
			return nil, err
		}
		out = append(out, p)
	}
	return out, nil
}

func (m Mapping) check(where string) (Port, error) {
	var p Port
	for _, f := range []struct {
		name string
		v    int
		to   *uint16
	}{{"hostPort", m.HostPort, &p.HostPort}, {"containerPort", m.ContainerPort, &p.ContainerPort}} {
		if f.v < 1 || f.v > 65535 {
			return p, fmt.Errorf("%s%s %d: must be a port, 1 to 65535", where, f.name, f.v)
		}
		*f.to = uint16(f.v)
	}
	proto := strings.ToLower(m.Protocol)
	if proto == "" {
		proto = "tcp" // Kubernetes' default, which runtimes spell out
	}
	n, ok := protocols[proto]
	if !ok {
		return p, fmt.Errorf("%sprotocol %q: must be tcp, udp or sctp", where, m.Protocol)
	}
	p.Proto = n
	if m.HostIP != "" {
		a, err := netip.ParseAddr(m.HostIP)
		if err != nil || a.Zone() != "" {
			return p, fmt.Errorf("%shostIP %q: must be an IP address", where, m.HostIP)
		}
		p.HostIP = a.Unmap()
	}
	return p, nil
}

// appliesTo says whether p maps to a pod address of ip's family: a
// mapping with a host address serves that address's family alone.
func (p Port) appliesTo(ip netip.Addr) bool {
	return !p.HostIP.IsValid() || p.HostIP.Is4() == ip.Is4()
}

// String is the mapping's host side, as an operator writes it: the host
// address (none for every one), the port and the protocol.
func (p Port) String() string {
	name := "tcp"
	for k, v := range protocols {
		if v == p.Proto {
			name = k
		}
	}
	host := ""
	if p.HostIP.IsValid() {
		host = p.HostIP.String()
	}
	if p.HostIP.Is6() {
		host = "[" + host + "]"
	}
	return fmt.Sprintf("%s:%d/%s", host, p.HostPort, name)
}
