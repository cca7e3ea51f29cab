package kube

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/netip"
	"slices"
	"sort"
	"strings"

	corev1 "k8s.io/api/core/v1"

	"github.com/twill-net/twill/subnet"
)

// Annotation suffixes under the configured prefix (default "twill.io/").
const (
	AnnBackendType         = "backend-type"
	AnnBackendData         = "backend-data"
	AnnBackendV6Data       = "backend-v6-data"
	AnnPublicIP            = "public-ip"
	AnnPublicIPv6          = "public-ipv6"
	AnnPublicIPOverwrite   = "public-ip-overwrite"
	AnnPublicIPv6Overwrite = "public-ipv6-overwrite"
	// AnnKubeSubnetManager says the node's lease is its podCIDR. flanneld
	// routes only to nodes that carry it as "true": with flannel's prefix
	// (--kube-annotation-prefix flannel.alpha.coreos.com), flannel nodes
	// and twill nodes route to each other while a cluster is switched.
	AnnKubeSubnetManager = "kube-subnet-manager"
	// AnnNodeAgent is "twill" on nodes twilld runs on: under flannel's
	// prefix, the nodes without it are the ones still on flanneld.
	AnnNodeAgent = "node-agent"
)

// FlannelAnnotationPrefix is flanneld's annotation prefix, which twill runs
// with while a flannel cluster is switched to it.
const FlannelAnnotationPrefix = "flannel.alpha.coreos.com"

// DefaultAnnotationPrefix is --kube-annotation-prefix's default.
const DefaultAnnotationPrefix = "twill.io"

// Annotations names twill's Node annotations under one prefix.
type Annotations struct{ prefix string }

// OnFlannel reports whether n is a peer published by flanneld rather than
// twilld: under flannel's prefix, a node without twill's node-agent
// annotation.
func (a Annotations) OnFlannel(n *corev1.Node) bool {
	_, twill := n.Annotations[a.Key(AnnNodeAgent)]
	return strings.TrimSuffix(a.prefix, "/") == FlannelAnnotationPrefix && !twill
}

// NewAnnotations checks prefix (a DNS subdomain such as "twill.io", with or
// without the trailing slash) and returns the annotation names under it.
func NewAnnotations(prefix string) (Annotations, error) {
	p := strings.TrimSuffix(prefix, "/")
	if p == "" || len(p) > 253 || strings.ContainsAny(p, "/ ") || strings.Trim(p, "abcdefghijklmnopqrstuvwxyz0123456789-.") != "" ||
		strings.HasPrefix(p, ".") || strings.HasSuffix(p, ".") || strings.HasPrefix(p, "-") || strings.HasSuffix(p, "-") {
		return Annotations{}, fmt.Errorf("--kube-annotation-prefix %q: must be a lower-case DNS subdomain such as %q", prefix, DefaultAnnotationPrefix)
	}
	return Annotations{prefix: p + "/"}, nil
}

// Key is the full annotation name for a suffix, e.g. "twill.io/public-ip".
func (a Annotations) Key(suffix string) string { return a.prefix + suffix }

// Owns reports whether an annotation name is under the prefix.
func (a Annotations) Owns(key string) bool { return strings.HasPrefix(key, a.prefix) }

// PodCIDRs returns a node's pod subnets, from spec.podCIDRs or, on older
// clusters, spec.podCIDR. Both invalid means the node has none yet.
func PodCIDRs(n *corev1.Node) (v4, v6 netip.Prefix, err error) {
	cidrs := n.Spec.PodCIDRs
	field := "spec.podCIDRs"
	if len(cidrs) == 0 && n.Spec.PodCIDR != "" {
		cidrs, field = []string{n.Spec.PodCIDR}, "spec.podCIDR"
	}
	for _, c := range cidrs {
		p, perr := netip.ParsePrefix(c)
		if perr != nil || p.Masked() != p {
			return v4, v6, fmt.Errorf("node %q: %s %q: not a CIDR without host bits", n.Name, field, c)
		}
		if !subnet.AddByFamily(&v4, &v6, p) {
			return netip.Prefix{}, netip.Prefix{}, fmt.Errorf("node %q: %s %q: more than one CIDR of a family", n.Name, field, strings.Join(cidrs, ","))
		}
	}
	return v4, v6, nil
}

// NodeLease turns a Node into the lease it publishes. ok is false when the
// node is not a peer yet: no podCIDR, or no twill annotations (twilld has
// not run there). A non-nil error means the node published something twill
// will not program, and says which field and value.
//
// A published public IP must be one of the node's status.addresses, unless
// it equals the node's public-ip-overwrite annotation (set by an operator).
func (a Annotations) NodeLease(n *corev1.Node) (l subnet.Lease, ok bool, err error) {
	ann := n.Annotations
	bt, has := ann[a.Key(AnnBackendType)]
	if !has {
		return l, false, nil
	}
	l.Subnet, l.IPv6Subnet, err = PodCIDRs(n)
	if err != nil {
		return l, false, err
	}
	// The apiserver sets it, and nobody can change it after: a Node that
	// copies another's key, MAC or address is the younger (ClaimOrder).
	l.Since = since(n)
	if !l.Subnet.IsValid() && !l.IPv6Subnet.IsValid() {
		return l, false, nil
	}
	if bt == "" {
		return l, false, fmt.Errorf("node %q: annotation %s %q: must name a backend", n.Name, a.Key(AnnBackendType), bt)
	}
	l.Attrs.BackendType = bt
	if l.Attrs.BackendData, err = a.jsonObject(n, AnnBackendData); err != nil {
		return l, false, err
	}
	if l.Attrs.BackendV6Data, err = a.jsonObject(n, AnnBackendV6Data); err != nil {
		return l, false, err
	}
	// An address of a pod family the node has is read (an IPv4 subnet
	// needs one). An address of the other family is read only when it is
	// the node's only one, as twilld publishes it (a vxlan overlay over
	// it): a stale one left from another configuration refuses no node.
	_, has4 := ann[a.Key(AnnPublicIP)]
	_, has6 := ann[a.Key(AnnPublicIPv6)]
	if l.Subnet.IsValid() || (has4 && !has6) {
		if l.Attrs.PublicIP, err = a.publicIP(n, AnnPublicIP, AnnPublicIPOverwrite, false); err != nil {
			return l, false, err
		}
	}
	if has6 && (l.IPv6Subnet.IsValid() || !has4) {
		if l.Attrs.PublicIPv6, err = a.publicIP(n, AnnPublicIPv6, AnnPublicIPv6Overwrite, true); err != nil {
			return l, false, err
		}
	}
	return l, true, nil
}

// since is a Node's Lease.Since: its creationTimestamp, or 0 when it has
// none (a Node built by hand, in a test).
func since(n *corev1.Node) int64 {
	if n.CreationTimestamp.IsZero() {
		return 0
	}
	return n.CreationTimestamp.Unix()
}

func (a Annotations) jsonObject(n *corev1.Node, suffix string) (json.RawMessage, error) {
	v := bytes.TrimSpace([]byte(n.Annotations[a.Key(suffix)]))
	if len(v) == 0 || string(v) == "null" {
		return nil, nil
	}
	var obj map[string]json.RawMessage
	if v[0] != '{' || json.Unmarshal(v, &obj) != nil {
		return nil, fmt.Errorf("node %q: annotation %s %q: must be a JSON object", n.Name, a.Key(suffix), clip(string(v)))
	}
	return json.RawMessage(v), nil
}

func (a Annotations) publicIP(n *corev1.Node, suffix, overwriteSuffix string, v6 bool) (netip.Addr, error) {
	key := a.Key(suffix)
	s := n.Annotations[key]
	ip, err := parseIP(s, v6)
	if err != nil {
		return netip.Addr{}, fmt.Errorf("node %q: annotation %s %q: %w", n.Name, key, clip(s), err)
	}
	if ow, set := n.Annotations[a.Key(overwriteSuffix)]; set {
		owIP, err := parseIP(ow, v6)
		if err != nil {
			return netip.Addr{}, fmt.Errorf("node %q: annotation %s %q: %w", n.Name, a.Key(overwriteSuffix), clip(ow), err)
		}
		if owIP == ip {
			return ip, nil // an operator vouched for it
		}
	}
	var have []string
	for _, addr := range n.Status.Addresses {
		if addr.Type != corev1.NodeInternalIP && addr.Type != corev1.NodeExternalIP {
			continue
		}
		if x, err := netip.ParseAddr(addr.Address); err == nil && x.Unmap() == ip {
			return ip, nil
		}
		have = append(have, addr.Address)
	}
	return netip.Addr{}, fmt.Errorf("node %q: annotation %s %q: not one of the node's status.addresses [%s] (set %s to publish another address)",
		n.Name, key, s, strings.Join(have, " "), a.Key(overwriteSuffix))
}

func parseIP(s string, v6 bool) (netip.Addr, error) {
	ip, err := netip.ParseAddr(s)
	switch {
	case err != nil:
		return netip.Addr{}, fmt.Errorf("not an IP address")
	case !v6 && !ip.Is4():
		return netip.Addr{}, fmt.Errorf("not an IPv4 address")
	case v6 && (!ip.Is6() || ip.Is4In6()):
		return netip.Addr{}, fmt.Errorf("not an IPv6 address")
	case ip.IsUnspecified() || ip.IsMulticast():
		return netip.Addr{}, fmt.Errorf("not a unicast address")
	}
	return ip, nil
}

func clip(s string) string {
	if len(s) > 64 {
		return s[:61] + "..."
	}
	return s
}

// Publish is the annotation set a node with these attributes carries.
func (a Annotations) Publish(attrs subnet.LeaseAttrs) map[string]string {
	m := map[string]string{a.Key(AnnBackendType): attrs.BackendType, a.Key(AnnKubeSubnetManager): "true", a.Key(AnnNodeAgent): "twill"}
	raw := func(r json.RawMessage) string {
		if len(bytes.TrimSpace(r)) == 0 {
			return "null"
		}
		return string(r)
	}
	m[a.Key(AnnBackendData)] = raw(attrs.BackendData)
	if attrs.PublicIP.IsValid() {
		m[a.Key(AnnPublicIP)] = attrs.PublicIP.String()
	}
	if attrs.PublicIPv6.IsValid() {
		m[a.Key(AnnPublicIPv6)] = attrs.PublicIPv6.String()
	}
	if attrs.PublicIPv6.IsValid() || len(bytes.TrimSpace(attrs.BackendV6Data)) > 0 {
		// vxlan carries IPv6 pods over an IPv4 underlay too: its IPv6
		// data goes with no IPv6 public address.
		m[a.Key(AnnBackendV6Data)] = raw(attrs.BackendV6Data)
	}
	return m
}

// Snapshot turns the nodes (other than self) into leases. It refuses nodes
// whose annotations do not parse, and, where pod subnets overlap, every
// node of the overlapping group but the oldest (by creationTimestamp):
// kube-controller-manager never assigns overlapping CIDRs, so the newcomer
// is the misconfigured one, and a working node keeps its routes. When the
// oldest cannot be told (same creation second), the whole group is refused.
func (a Annotations) Snapshot(nodes []*corev1.Node, self string) subnet.Snapshot {
	entries, _ := a.Entries(nodes, self)
	return subnet.SnapshotOf(entries)
}

// EntryKey is a Node's key in the entries: "node/<name>".
func EntryKey(name string) string { return "node/" + name }

// Entries is Snapshot as keyed entries (see subnet.Change), with the names
// of the nodes whose pod subnet overlaps another's: a change to one of
// them, or a new overlap, can change other entries too.
func (a Annotations) Entries(nodes []*corev1.Node, self string) (entries []subnet.Entry, overlapping map[string]bool) {
	var ok []namedLease
	for _, n := range nodes {
		if n.Name == self {
			continue
		}
		l, peer, err := a.NodeLease(n)
		if err != nil {
			entries = append(entries, subnet.Entry{Key: EntryKey(n.Name), Err: err})
			continue
		}
		if peer {
			ok = append(ok, namedLease{n, l})
		}
	}
	loser := map[int]int{}
	groups := map[int]bool{} // indexes in ok of every node in an overlapping group
	markOverlaps(ok, func(l subnet.Lease) netip.Prefix { return l.Subnet }, loser, groups)
	markOverlaps(ok, func(l subnet.Lease) netip.Prefix { return l.IPv6Subnet }, loser, groups)
	overlapping = map[string]bool{}
	for i := range groups {
		overlapping[ok[i].node.Name] = true
	}
	for i, n := range ok {
		e := subnet.Entry{Key: EntryKey(n.node.Name), Lease: n.lease}
		if w, lost := loser[i]; lost {
			e.Err = fmt.Errorf("node %q: pod subnet %s overlaps that of node %q, which is older", n.node.Name, podCIDRString(n.lease), ok[max(w, 0)].node.Name)
			if w == tieLoser {
				e.Err = fmt.Errorf("node %q: pod subnet %s overlaps another node's created in the same second; refusing both", n.node.Name, podCIDRString(n.lease))
			}
		}
		entries = append(entries, e)
	}
	return entries, overlapping
}

type namedLease struct {
	node  *corev1.Node
	lease subnet.Lease
}

// tieLoser marks a node that overlaps another created in the same second.
const tieLoser = -1

// markOverlaps records in loser, for the leases whose prefix of one family
// (fam) overlaps another's, the index of the oldest node of the group they
// yield to, or tieLoser.
func markOverlaps(ok []namedLease, fam func(subnet.Lease) netip.Prefix, loser map[int]int, groups map[int]bool) {
	idx := make([]int, 0, len(ok))
	for i := range ok {
		if fam(ok[i].lease).IsValid() {
			idx = append(idx, i)
		}
	}
	sort.Slice(idx, func(x, y int) bool {
		p, q := fam(ok[idx[x]].lease), fam(ok[idx[y]].lease)
		if c := p.Addr().Compare(q.Addr()); c != 0 {
			return c < 0
		}
		return p.Bits() < q.Bits()
	})
	// Prefixes nest or are disjoint: sorted by start, the ones that
	// overlap form runs under a first, widest prefix.
	for start := 0; start < len(idx); {
		end := start + 1
		top := fam(ok[idx[start]].lease)
		for end < len(idx) && top.Overlaps(fam(ok[idx[end]].lease)) {
			end++
		}
		if end-start > 1 {
			for _, i := range idx[start:end] {
				groups[i] = true
			}
			win := idx[start]
			for _, i := range idx[start+1 : end] {
				if ok[i].node.CreationTimestamp.Before(&ok[win].node.CreationTimestamp) {
					win = i
				}
			}
			for _, i := range idx[start:end] {
				switch {
				case i == win:
				case ok[i].node.CreationTimestamp.Equal(&ok[win].node.CreationTimestamp):
					loser[i], loser[win] = tieLoser, tieLoser
				default:
					if loser[i] != tieLoser {
						loser[i] = win
					}
				}
			}
		}
		start = end
	}
}

func podCIDRString(l subnet.Lease) string {
	switch {
	case l.Subnet.IsValid() && l.IPv6Subnet.IsValid():
		return l.Subnet.String() + "," + l.IPv6Subnet.String()
	case l.Subnet.IsValid():
		return l.Subnet.String()
	}
	return l.IPv6Subnet.String()
}

// strip keeps only what twill reads from a Node, so that the informer
// cache of a large cluster stays small: name, twill's annotations, pod
// CIDRs, addresses and the NetworkUnavailable condition.
func (a Annotations) strip(obj any) (any, error) {
	n, ok := obj.(*corev1.Node)
	if !ok {
		return obj, nil
	}
	out := &corev1.Node{}
	out.Name, out.ResourceVersion, out.UID, out.CreationTimestamp = n.Name, n.ResourceVersion, n.UID, n.CreationTimestamp
	for k, v := range n.Annotations {
		if a.Owns(k) {
			if out.Annotations == nil {
				out.Annotations = map[string]string{}
			}
			out.Annotations[k] = v
		}
	}
	out.Spec.PodCIDR = n.Spec.PodCIDR
	out.Spec.PodCIDRs = slices.Clip(n.Spec.PodCIDRs)
	out.Status.Addresses = slices.Clip(n.Status.Addresses)
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeNetworkUnavailable {
			out.Status.Conditions = []corev1.NodeCondition{{Type: c.Type, Status: c.Status, Reason: c.Reason}}
		}
	}
	return out, nil
}
