package kube

import (
	"net/netip"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/twill-net/twill/subnet"
)

func ann(t testing.TB) Annotations {
	a, err := NewAnnotations("twill.io")
	if err != nil {
		t.Fatal(err)
	}
	return a
}

func node(name, cidr, addr string, annotations map[string]string) *corev1.Node {
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Annotations: annotations}}
	n.Spec.PodCIDR = cidr
	if cidr != "" {
		n.Spec.PodCIDRs = []string{cidr}
	}
	n.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: addr}, {Type: corev1.NodeHostName, Address: name}}
	return n
}

func published(ip string) map[string]string {
	return map[string]string{"twill.io/backend-type": "host-gw", "twill.io/backend-data": "null", "twill.io/public-ip": ip}
}

func TestNewAnnotations(t *testing.T) {
	for _, ok := range []string{"twill.io", "twill.io/", "net.example.com"} {
		if _, err := NewAnnotations(ok); err != nil {
			t.Errorf("%q: %v", ok, err)
		}
	}
	for _, bad := range []string{"", "/", "Twill.io", "a/b", "-x.io", "x.io.", "a b"} {
		_, err := NewAnnotations(bad)
		if err == nil || !strings.Contains(err.Error(), "--kube-annotation-prefix") {
			t.Errorf("%q: err %v, want one naming --kube-annotation-prefix", bad, err)
		}
	}
}

func TestNodeLease(t *testing.T) {
	a := ann(t)
	l, ok, err := a.NodeLease(node("n1", "10.244.1.0/24", "192.168.0.1", published("192.168.0.1")))
	if err != nil || !ok || l.Subnet.String() != "10.244.1.0/24" || l.Attrs.PublicIP.String() != "192.168.0.1" || l.Attrs.BackendType != "host-gw" {
		t.Fatalf("good node: %+v %v %v", l, ok, err)
	}
	// Not a peer yet: no annotations, or no podCIDR.
	if _, ok, err := a.NodeLease(node("n2", "10.244.2.0/24", "192.168.0.2", nil)); ok || err != nil {
		t.Errorf("node without annotations: ok %v err %v; want not a peer, no error", ok, err)
	}
	if _, ok, err := a.NodeLease(node("n3", "", "192.168.0.3", published("192.168.0.3"))); ok || err != nil {
		t.Errorf("node without podCIDR: ok %v err %v; want not a peer, no error", ok, err)
	}
	// Only spec.podCIDR (old clusters).
	n := node("n4", "10.244.4.0/24", "192.168.0.4", published("192.168.0.4"))
	n.Spec.PodCIDRs = nil
	if l, ok, err := a.NodeLease(n); err != nil || !ok || l.Subnet.String() != "10.244.4.0/24" {
		t.Errorf("spec.podCIDR only: %+v %v %v", l, ok, err)
	}
	// Dual stack.
	n = node("n5", "10.244.5.0/24", "192.168.0.5", published("192.168.0.5"))
	n.Spec.PodCIDRs = []string{"10.244.5.0/24", "fd00:5::/64"}
	if l, ok, err := a.NodeLease(n); err != nil || !ok || l.IPv6Subnet.String() != "fd00:5::/64" {
		t.Errorf("dual stack: %+v %v %v", l, ok, err)
	}
}

func TestNodeLeaseRefusals(t *testing.T) {
	a := ann(t)
	with := func(k, v string) map[string]string {
		m := published("192.168.0.9")
		m[k] = v
		return m
	}
	for _, tc := range []struct {
		name string
		n    *corev1.Node
		want []string // in the error
	}{
		{"bad json", node("x", "10.244.9.0/24", "192.168.0.9", with("twill.io/backend-data", "{not json")),
			[]string{`node "x"`, "twill.io/backend-data", "{not json", "JSON object"}},
		{"array data", node("x", "10.244.9.0/24", "192.168.0.9", with("twill.io/backend-data", "[1]")),
			[]string{"twill.io/backend-data", `"[1]"`}},
		{"bad ip", node("x", "10.244.9.0/24", "192.168.0.9", with("twill.io/public-ip", "10.0.0.300")),
			[]string{"twill.io/public-ip", "10.0.0.300", "not an IP"}},
		{"v6 as public-ip", node("x", "10.244.9.0/24", "192.168.0.9", with("twill.io/public-ip", "fd00::1")),
			[]string{"twill.io/public-ip", "not an IPv4"}},
		{"missing ip", node("x", "10.244.9.0/24", "192.168.0.9", with("twill.io/public-ip", "")),
			[]string{"twill.io/public-ip", `""`}},
		{"spoofed ip", node("x", "10.244.9.0/24", "192.168.0.9", with("twill.io/public-ip", "192.168.0.1")),
			[]string{"192.168.0.1", "not one of the node's status.addresses", "192.168.0.9", "twill.io/public-ip-overwrite"}},
		{"empty backend", node("x", "10.244.9.0/24", "192.168.0.9", with("twill.io/backend-type", "")),
			[]string{"twill.io/backend-type"}},
		{"bad cidr", node("x", "10.244.9.1/24", "192.168.0.9", published("192.168.0.9")),
			[]string{"spec.podCIDRs", "10.244.9.1/24"}},
	} {
		_, ok, err := a.NodeLease(tc.n)
		if err == nil || ok {
			t.Errorf("%s: ok %v err %v; want a refusal", tc.name, ok, err)
			continue
		}
		for _, w := range tc.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s: error %q does not mention %q", tc.name, err, w)
			}
		}
	}
	// The operator's overwrite vouches for an address not in status.addresses.
	m := with("twill.io/public-ip", "203.0.113.7")
	m["twill.io/public-ip-overwrite"] = "203.0.113.7"
	if l, ok, err := a.NodeLease(node("x", "10.244.9.0/24", "192.168.0.9", m)); err != nil || !ok || l.Attrs.PublicIP.String() != "203.0.113.7" {
		t.Errorf("overwrite: %+v %v %v", l, ok, err)
	}
}

func TestSnapshotOverlapKeepsOldest(t *testing.T) {
	a := ann(t)
	t0 := time.Now()
	mk := func(name, cidr, ip string, age time.Duration) *corev1.Node {
		n := node(name, cidr, ip, published(ip))
		n.CreationTimestamp = metav1.NewTime(t0.Add(-age))
		return n
	}
	nodes := []*corev1.Node{
		mk("self", "10.244.0.0/24", "192.168.0.10", time.Hour),
		mk("old", "10.244.2.0/24", "192.168.0.2", time.Hour),
		mk("dup", "10.244.2.0/24", "192.168.0.3", time.Minute),
		mk("wide", "10.244.0.0/23", "192.168.0.4", time.Second), // covers 10.244.1.0/24 below
		mk("inner", "10.244.1.0/24", "192.168.0.5", 2*time.Hour),
		mk("fine", "10.244.3.0/24", "192.168.0.6", time.Second),
	}
	snap := a.Snapshot(nodes, "self")
	var got []string
	for _, l := range snap.Leases {
		got = append(got, l.Subnet.String()+"@"+l.Attrs.PublicIP.String())
	}
	want := "10.244.2.0/24@192.168.0.2 10.244.1.0/24@192.168.0.5 10.244.3.0/24@192.168.0.6"
	if strings.Join(got, " ") != want {
		t.Errorf("leases %v, want %s", got, want)
	}
	refused := map[string]string{}
	for _, r := range snap.Refused {
		refused[r.Key] = r.Err.Error()
	}
	if !strings.Contains(refused["node/dup"], `overlaps that of node "old"`) || !strings.Contains(refused["node/wide"], `node "inner"`) || len(refused) != 2 {
		t.Errorf("refused %v; want dup (yields to old) and wide (yields to inner)", refused)
	}
}

func TestStripKeepsWhatTwillReads(t *testing.T) {
	a := ann(t)
	n := node("n1", "10.244.1.0/24", "192.168.0.1", published("192.168.0.1"))
	n.Annotations["other.io/big"] = strings.Repeat("x", 1000)
	n.Status.Images = []corev1.ContainerImage{{Names: []string{"a"}, SizeBytes: 1}}
	n.ManagedFields = []metav1.ManagedFieldsEntry{{Manager: "kubelet"}}
	n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue},
		{Type: corev1.NodeNetworkUnavailable, Status: corev1.ConditionFalse, Reason: ConditionReason, Message: "long"}}
	obj, _ := a.strip(n)
	s := obj.(*corev1.Node)
	if len(s.Annotations) != 3 || s.Status.Images != nil || s.ManagedFields != nil || len(s.Status.Conditions) != 1 || s.Status.Conditions[0].Message != "" {
		t.Errorf("stripped node keeps too much: %+v", s)
	}
	l1, _, err1 := a.NodeLease(n)
	l2, _, err2 := a.NodeLease(s)
	if err1 != nil || err2 != nil || l1.Subnet != l2.Subnet || !l1.Attrs.Equal(l2.Attrs) {
		t.Errorf("stripping changed the lease: %+v / %+v (%v %v)", l1, l2, err1, err2)
	}
}

func FuzzNodeLease(f *testing.F) {
	f.Add("10.244.1.0/24", "host-gw", `{"VNI":1,"VtepMAC":"0a:00:00:00:00:01"}`, "192.168.0.1", "")
	f.Add("fd00::/64", "vxlan", "null", "", "192.168.0.1")
	f.Add("10.244.1.0/24", "", "{", "1.2.3.4", "1.2.3.4")
	a := ann(f)
	f.Fuzz(func(t *testing.T, cidr, bt, data, ip, overwrite string) {
		m := map[string]string{"twill.io/backend-type": bt, "twill.io/backend-data": data, "twill.io/public-ip": ip}
		if overwrite != "" {
			m["twill.io/public-ip-overwrite"] = overwrite
		}
		l, ok, err := a.NodeLease(node("f", cidr, "192.168.0.1", m))
		if err != nil {
			if ok || !strings.Contains(err.Error(), `node "f"`) {
				t.Fatalf("error %q (ok %v) must name the node and not be a peer", err, ok)
			}
			return
		}
		if ok && l.Subnet.IsValid() && !l.Attrs.PublicIP.IsValid() {
			t.Fatalf("IPv4 peer without a public IP: %+v", l)
		}
	})
}

func TestSnapshotOverlapSameSecondRefusesBoth(t *testing.T) {
	a := ann(t)
	ts := metav1.NewTime(time.Now().Truncate(time.Second))
	x := node("x", "10.244.7.0/24", "192.168.0.7", published("192.168.0.7"))
	y := node("y", "10.244.7.0/24", "192.168.0.8", published("192.168.0.8"))
	x.CreationTimestamp, y.CreationTimestamp = ts, ts
	snap := a.Snapshot([]*corev1.Node{x, y}, "self")
	if len(snap.Leases) != 0 || len(snap.Refused) != 2 || !strings.Contains(snap.Refused[0].Err.Error(), "same second") {
		t.Errorf("same-age overlap: leases %v refused %v; want both refused", snap.Leases, snap.Refused)
	}
}

// TestNodeLeaseIPv6: an IPv6-only Node whose vxlan overlay runs over IPv4
// still has its public-ip read (and checked against its addresses), and a
// public-ipv6 that is not one of its addresses is refused.
func TestNodeLeaseIPv6(t *testing.T) {
	a := ann(t)
	n := node("n1", "fd00:10:0:1::/64", "192.168.0.1", map[string]string{"twill.io/backend-type": "vxlan",
		"twill.io/backend-data": "null", "twill.io/backend-v6-data": `{"VNI":1,"VtepMAC":"0a:00:00:00:00:01"}`, "twill.io/public-ip": "192.168.0.1"})
	l, ok, err := a.NodeLease(n)
	if err != nil || !ok || l.IPv6Subnet.String() != "fd00:10:0:1::/64" || l.Attrs.PublicIP.String() != "192.168.0.1" || len(l.Attrs.BackendV6Data) == 0 {
		t.Fatalf("IPv6-only node over IPv4: %+v %v %v", l, ok, err)
	}
	n.Annotations["twill.io/public-ip"] = "192.168.0.9"
	if _, _, err := a.NodeLease(n); err == nil || !strings.Contains(err.Error(), "not one of the node's status.addresses") {
		t.Errorf("a public-ip not the node's: err %v", err)
	}
	n.Annotations["twill.io/public-ip"] = "192.168.0.1"
	n.Annotations["twill.io/public-ipv6"] = "fd99::9"
	if _, _, err := a.NodeLease(n); err == nil || !strings.Contains(err.Error(), "twill.io/public-ipv6") {
		t.Errorf("a public-ipv6 not the node's: err %v", err)
	}
	// An IPv4 Node with a public-ipv6 left from a dual-stack past (no
	// longer among its addresses) is not refused for it.
	stale := node("n2", "10.244.2.0/24", "192.168.0.2", published("192.168.0.2"))
	stale.Annotations["twill.io/public-ipv6"] = "fd99::2"
	if l, ok, err := a.NodeLease(stale); err != nil || !ok || l.Attrs.PublicIPv6.IsValid() {
		t.Errorf("IPv4 node with a stale public-ipv6: %+v %v %v; want it a peer, the address unread", l, ok, err)
	}
	// vxlan's IPv6 data is published with no IPv6 public address.
	pub := a.Publish(subnet.LeaseAttrs{BackendType: "vxlan", PublicIP: netip.MustParseAddr("192.168.0.1"),
		BackendData: []byte(`{"VNI":1}`), BackendV6Data: []byte(`{"VNI":1}`)})
	if pub["twill.io/backend-v6-data"] != `{"VNI":1}` || pub["twill.io/public-ipv6"] != "" {
		t.Errorf("published %v: want backend-v6-data, no public-ipv6", pub)
	}
}

// TestPublishForFlannel: under flannel's prefix, a node twill runs on
// publishes what flanneld needs to route to it, a node that never ran
// flanneld included: flanneld ignores Nodes without kube-subnet-manager.
func TestPublishForFlannel(t *testing.T) {
	a, err := NewAnnotations("flannel.alpha.coreos.com")
	if err != nil {
		t.Fatal(err)
	}
	pub := a.Publish(subnet.LeaseAttrs{BackendType: "vxlan", PublicIP: netip.MustParseAddr("192.168.0.1"),
		BackendData: []byte(`{"VNI":1,"VtepMAC":"0a:58:3c:4e:11:02"}`)})
	want := map[string]string{
		"flannel.alpha.coreos.com/kube-subnet-manager": "true",
		"flannel.alpha.coreos.com/backend-type":        "vxlan",
		"flannel.alpha.coreos.com/backend-data":        `{"VNI":1,"VtepMAC":"0a:58:3c:4e:11:02"}`,
		"flannel.alpha.coreos.com/public-ip":           "192.168.0.1",
	}
	for k, v := range want {
		if pub[k] != v {
			t.Errorf("%s = %q, want %q (published %v)", k, pub[k], v, pub)
		}
	}
}

// Which addresses vouch for a public IP, in each family: the Node's
// InternalIP and ExternalIP of that family. A Hostname or InternalDNS entry
// that happens to be written as an IP does not (kubelet does not check
// them as addresses), nor does an address of the other family.
func TestNodeLeaseAddressTypes(t *testing.T) {
	a := ann(t)
	for _, tc := range []struct {
		name    string
		typ     corev1.NodeAddressType
		addr    string
		key     string
		pub     string
		vouched bool
	}{
		{"v4 InternalIP", corev1.NodeInternalIP, "192.168.0.9", "twill.io/public-ip", "192.168.0.9", true},
		{"v4 ExternalIP", corev1.NodeExternalIP, "192.168.0.9", "twill.io/public-ip", "192.168.0.9", true},
		{"v4 Hostname", corev1.NodeHostName, "192.168.0.9", "twill.io/public-ip", "192.168.0.9", false},
		{"v4 InternalDNS", corev1.NodeInternalDNS, "192.168.0.9", "twill.io/public-ip", "192.168.0.9", false},
		{"v6 InternalIP", corev1.NodeInternalIP, "fd00::9", "twill.io/public-ipv6", "fd00::9", true},
		{"v6 ExternalIP", corev1.NodeExternalIP, "fd00::9", "twill.io/public-ipv6", "fd00::9", true},
		{"v6 Hostname", corev1.NodeHostName, "fd00::9", "twill.io/public-ipv6", "fd00::9", false},
		{"v4-mapped v6 for a v4", corev1.NodeInternalIP, "::ffff:192.168.0.9", "twill.io/public-ip", "192.168.0.9", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := map[string]string{"twill.io/backend-type": "host-gw", tc.key: tc.pub}
			n := node("x", "10.244.9.0/24", "192.168.0.250", m)
			if tc.key == "twill.io/public-ipv6" {
				n.Spec.PodCIDRs = []string{"10.244.9.0/24", "fd00:9::/64"}
				m["twill.io/public-ip"] = "192.168.0.250"
			}
			n.Status.Addresses = append(n.Status.Addresses, corev1.NodeAddress{Type: tc.typ, Address: tc.addr})
			_, _, err := a.NodeLease(n)
			if got := err == nil; got != tc.vouched {
				t.Errorf("%s %s as %s: err %v; want vouched %v", tc.typ, tc.addr, tc.key, err, tc.vouched)
			}
		})
	}
}

// Under flannel's prefix, a node without twill's node-agent annotation is
// on flanneld; under twill's own prefix, none is.
func TestOnFlannel(t *testing.T) {
	fl, err := NewAnnotations(FlannelAnnotationPrefix)
	if err != nil {
		t.Fatal(err)
	}
	flannelNode := node("a", "10.244.1.0/24", "192.168.0.1", map[string]string{"flannel.alpha.coreos.com/backend-type": "vxlan"})
	twillNode := node("b", "10.244.2.0/24", "192.168.0.2", fl.Publish(subnet.LeaseAttrs{BackendType: "vxlan"}))
	if !fl.OnFlannel(flannelNode) || fl.OnFlannel(twillNode) {
		t.Errorf("OnFlannel: flanneld's node %v, twilld's %v; want true, false", fl.OnFlannel(flannelNode), fl.OnFlannel(twillNode))
	}
	if tw := ann(t); tw.OnFlannel(flannelNode) {
		t.Error("under twill.io, a node is never flannel's")
	}
}

// A podCIDR missing for an enabled family, or outside its network, is
// refused with the node, the field and both values named.
func TestFitConfigNamesTheField(t *testing.T) {
	for _, c := range []struct {
		v4, v6 string
		want   string
	}{
		{"", "fd00:10::/64", `node "n1": spec.podCIDRs has no IPv4 CIDR, but net-conf.json enables IPv4 (Network 10.244.0.0/16)`},
		{"10.9.1.0/24", "fd00:10::/64", `node "n1": spec.podCIDR 10.9.1.0/24: not inside net-conf.json Network 10.244.0.0/16`},
		{"10.244.1.0/24", "", `node "n1": spec.podCIDRs has no IPv6 CIDR, but net-conf.json enables IPv6 (IPv6Network fd00:10::/56)`},
		{"10.244.1.0/24", "fd00:99::/64", `node "n1": spec.podCIDR fd00:99::/64: not inside net-conf.json IPv6Network fd00:10::/56`},
	} {
		cfg := &subnet.Config{EnableIPv4: true, EnableIPv6: true,
			Network: netip.MustParsePrefix("10.244.0.0/16"), IPv6Network: netip.MustParsePrefix("fd00:10::/56")}
		var v4, v6 netip.Prefix
		if c.v4 != "" {
			v4 = netip.MustParsePrefix(c.v4)
		}
		if c.v6 != "" {
			v6 = netip.MustParsePrefix(c.v6)
		}
		err := fitConfig(cfg, "n1", v4, v6)
		if err == nil || !strings.HasPrefix(err.Error(), c.want) {
			t.Errorf("podCIDRs %q %q: %v, want %s", c.v4, c.v6, err, c.want)
		}
	}
}
