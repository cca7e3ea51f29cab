package policy

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"

	"github.com/twill-net/twill/policy/cnpapi"
)

// Cluster is the apiserver's state that Explain reads. Explain compiles
// it for the nodes of the two pods with Compile, as their twilld does, and
// runs the packet through each table with Evaluate.
type Cluster struct {
	Nodes      []*corev1.Node
	Pods       []*corev1.Pod
	Namespaces []*corev1.Namespace
	Policies   []*networkingv1.NetworkPolicy
	// ClusterPolicies are the ClusterNetworkPolicies (none when their CRD
	// is not installed).
	ClusterPolicies []*cnpapi.ClusterNetworkPolicy

	compiled map[string]Ruleset // by node
}

// Query is a connection to explain: from one pod to another, on a port.
type Query struct {
	From, To string // namespace/name
	Proto    uint8  // IPPROTO_TCP, UDP or SCTP
	Port     uint16
	V6       bool // the pods' IPv6 addresses (else IPv4, or the one family they have)
}

// Answer is Explain's verdict, and why.
type Answer struct {
	Query
	Src, Dst         netip.Addr
	SrcNode, DstNode string
	Allowed          bool
	// Egress and Ingress say what decided in each direction: the rule that
	// let the connection through, or the pod's default deny, or that no
	// policy isolates the pod.
	Egress, Ingress string
}

// Explain says whether q's connection is allowed, and by what.
func (c *Cluster) Explain(q Query) (Answer, error) {
	a := Answer{Query: q}
	from, err := c.pod(q.From)
	if err != nil {
		return a, err
	}
	to, err := c.pod(q.To)
	if err != nil {
		return a, err
	}
	a.SrcNode, a.DstNode = from.Spec.NodeName, to.Spec.NodeName
	if a.Src, a.Dst, err = addrPair(from, to, q.V6); err != nil {
		return a, err
	}
	pkt := Packet{Src: a.Src, Dst: a.Dst, Proto: q.Proto, Port: q.Port}
	egress := Evaluate(c.ruleset(a.SrcNode), pkt)
	ingress := egress
	if a.DstNode != a.SrcNode {
		ingress = Evaluate(c.ruleset(a.DstNode), pkt)
	}
	a.Allowed = egress.Allowed && ingress.Allowed
	a.Egress = side(egress, "eg", q.From, a.Src)
	a.Ingress = side(ingress, "in", q.To, a.Dst)
	return a, nil
}

// side says what decided in one direction, from a node's trace.
func side(t Trace, dir, podKey string, ip netip.Addr) string {
	chain, what := ChainName(dir, podKey), dirField(dir)
	unknown := "unknown destination"
	if dir == "eg" {
		unknown = "unknown source"
	}
	for _, s := range t.Steps {
		mine := s.Entry == chain // its chain, its rest chain, or a shared Admin chain
		switch {
		case mine && s.Verdict == Return:
			return "allowed by " + s.Why
		case mine && s.Verdict == Drop && s.Why != "":
			return "denied by " + s.Why
		case mine && s.Verdict == Drop:
			return fmt.Sprintf("denied: %s is isolated for %s and no rule of the policies that select it allows this (%q)", podKey, what, s.Comment)
		case s.Chain == ChainForward && s.Verdict == Drop && s.Comment == unknown:
			return fmt.Sprintf("denied: %s (%s) is not yet known to its node's twilld (%q)", podKey, ip, s.Comment)
		}
	}
	if !t.Allowed && dir == "in" {
		return "not reached: dropped on egress first"
	}
	if slices.Contains(t.Isolated, chain) {
		return fmt.Sprintf("allowed: no rule of the ClusterNetworkPolicies that select %s for %s decided (the default)", podKey, what)
	}
	return fmt.Sprintf("allowed: no policy selects %s for %s", podKey, what)
}

func (a Answer) String() string {
	verdict := "denied"
	if a.Allowed {
		verdict = "allowed"
	}
	return fmt.Sprintf("%s (%s, node %s) -> %s (%s, node %s) %d/%s: %s\n  egress:  %s\n  ingress: %s\n",
		a.From, a.Src, a.SrcNode, a.To, a.Dst, a.DstNode, a.Port, ProtoName(a.Proto), verdict, a.Egress, a.Ingress)
}

// ProtoName names an IP protocol as the verdict log and explain print it.
func ProtoName(p uint8) string {
	switch p {
	case unix.IPPROTO_TCP:
		return "tcp"
	case unix.IPPROTO_UDP:
		return "udp"
	case unix.IPPROTO_SCTP:
		return "sctp"
	case unix.IPPROTO_ICMP:
		return "icmp"
	case unix.IPPROTO_ICMPV6:
		return "icmpv6"
	}
	return fmt.Sprint(p)
}

// ParsePort reads "80/tcp" (or "53/udp", "9/sctp"; "80" is TCP).
func ParsePort(s string) (proto uint8, port uint16, err error) {
	num, name, slash := strings.Cut(s, "/")
	var n uint64
	if _, err := fmt.Sscan(num, &n); err != nil || n == 0 || n > 65535 || fmt.Sprint(n) != num {
		return 0, 0, fmt.Errorf("port %q: want a number from 1 to 65535, then /tcp, /udp or /sctp", s)
	}
	if !slash {
		name = "tcp"
	}
	switch strings.ToLower(name) {
	case "tcp":
		return unix.IPPROTO_TCP, uint16(n), nil
	case "udp":
		return unix.IPPROTO_UDP, uint16(n), nil
	case "sctp":
		return unix.IPPROTO_SCTP, uint16(n), nil
	}
	return 0, 0, fmt.Errorf("port %q: protocol %q: want tcp, udp or sctp", s, name)
}

func (c *Cluster) pod(key string) (*corev1.Pod, error) {
	ns, name, ok := strings.Cut(key, "/")
	if !ok || ns == "" || name == "" {
		return nil, fmt.Errorf("pod %q: want namespace/name", key)
	}
	for _, p := range c.Pods {
		if p.Namespace == ns && p.Name == name {
			if podOf(p, "") == nil {
				return nil, fmt.Errorf("pod %s: not on the pod network with an address (hostNetwork, finished, or not started)", key)
			}
			return p, nil
		}
	}
	return nil, fmt.Errorf("pod %s: not found", key)
}

// addrPair picks the two pods' addresses of one family.
func addrPair(from, to *corev1.Pod, v6 bool) (netip.Addr, netip.Addr, error) {
	pick := func(p *corev1.Pod, v6 bool) netip.Addr {
		for _, a := range podOf(p, "").ips {
			if a.Is6() == v6 {
				return a
			}
		}
		return netip.Addr{}
	}
	src, dst := pick(from, v6), pick(to, v6)
	if !v6 && (!src.IsValid() || !dst.IsValid()) { // IPv6-only pods
		src, dst = pick(from, true), pick(to, true)
	}
	if !src.IsValid() || !dst.IsValid() {
		return src, dst, fmt.Errorf("pods %s/%s and %s/%s have no address of the same family", from.Namespace, from.Name, to.Namespace, to.Name)
	}
	return src, dst, nil
}

// Compiled is node's table as its twilld compiles the Cluster.
func (c *Cluster) Compiled(node string) Ruleset { return c.ruleset(node) }

// ruleset is node's table, compiled once.
func (c *Cluster) ruleset(node string) Ruleset {
	if rs, ok := c.compiled[node]; ok {
		return rs
	}
	s := Snapshot{Node: node, Pods: c.Pods, Namespaces: c.Namespaces, Policies: c.Policies, ClusterPolicies: c.ClusterPolicies, Nodes: c.Nodes}
	for _, n := range c.Nodes {
		if n.Name != node {
			continue
		}
		cidrs := n.Spec.PodCIDRs
		if len(cidrs) == 0 && n.Spec.PodCIDR != "" {
			cidrs = []string{n.Spec.PodCIDR}
		}
		for _, s1 := range cidrs {
			if p, err := netip.ParsePrefix(s1); err == nil {
				s.LocalCIDRs = append(s.LocalCIDRs, p.Masked())
			}
		}
	}
	rs := Compile(s).Ruleset
	if c.compiled == nil {
		c.compiled = map[string]Ruleset{}
	}
	c.compiled[node] = rs
	return rs
}
