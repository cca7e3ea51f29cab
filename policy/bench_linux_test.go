package policy

import (
	"fmt"
	"net/netip"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/twill-net/twill/testsupport/policyscale"
)

// scale is a cluster of 1,000 pods over 3 nodes in 10 namespaces, and 500
// policies: each selects one app's pods and lets in two roles on port 80.
// Node n holds 10.244.2n.0/23; pod i is on node i%3 at scalePodIP(i).
func scale() Snapshot {
	s := Snapshot{Node: "n0", LocalCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.0.0/23")}}
	for i := range 10 {
		s.Namespaces = append(s.Namespaces, testNS(fmt.Sprintf("ns%d", i), map[string]string{"tier": fmt.Sprint(i % 3)}))
	}
	for i := range 1000 {
		node := i % 3
		ip := scalePodIP(i)
		s.Pods = append(s.Pods, testPod(fmt.Sprintf("ns%d", i%10), fmt.Sprintf("p%d", i), fmt.Sprintf("n%d", node), ip,
			map[string]string{"app": fmt.Sprintf("app%d", i%50), "role": fmt.Sprintf("r%d", i%7)},
			corev1.ContainerPort{Name: "http", ContainerPort: 80}))
	}
	p80 := intstr.FromInt32(80)
	for i := range 500 {
		np := testPolicy(fmt.Sprintf("ns%d", i%10), fmt.Sprintf("pol%d", i), map[string]string{"app": fmt.Sprintf("app%d", i%50)}, func(sp *networkingv1.NetworkPolicySpec) {
			sp.Ingress = []networkingv1.NetworkPolicyIngressRule{{
				From: []networkingv1.NetworkPolicyPeer{
					{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"role": fmt.Sprintf("r%d", i%7)}}},
					{NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"tier": fmt.Sprint(i % 3)}},
						PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"role": fmt.Sprintf("r%d", (i+1)%7)}}},
				},
				Ports: []networkingv1.NetworkPolicyPort{{Port: &p80}},
			}}
		})
		s.Policies = append(s.Policies, np)
	}
	return s
}

// scalePodIP is pod i's address in scale(): the (2+i/3)th of its node's
// /23.
func scalePodIP(i int) string {
	host := 2 + i/3
	return fmt.Sprintf("10.244.%d.%d", 2*(i%3)+host/256, host%256)
}

// BenchmarkPolicyChange: a label change at 1,000 pods and 500 policies,
// from the informers' state to the kernel's table (Compile, then Sync's
// read, diff and write), p50 and p99 over 50 changes; and Compile alone.
func BenchmarkPolicyChange(b *testing.B) {
	benchChange(b, newNode(b).tb, scale())
}

// BenchmarkClusterPolicyChange is BenchmarkPolicyChange with 50
// ClusterNetworkPolicies beside the 500 NetworkPolicies (scaleCluster).
func BenchmarkClusterPolicyChange(b *testing.B) {
	benchChange(b, newNode(b).tb, scaleCluster())
}

// scaleCluster is scale() and 50 ClusterNetworkPolicies, 25 of each tier
// (policyscale.ClusterPolicies): every local pod is selected by eight or
// nine Admin policies and by the Baseline ones of its app.
func scaleCluster() Snapshot {
	s := scale()
	s.ClusterPolicies = policyscale.ClusterPolicies(50)
	return s
}

func benchChange(b *testing.B, tb *Table, s Snapshot) {
	rs := Compile(s).Ruleset
	if _, err := tb.Sync(rs, false); err != nil {
		b.Fatal(err)
	}
	var rules, elems int
	for _, c := range rs.Chains {
		rules += len(c.Rules)
	}
	for _, st := range rs.Sets {
		elems += len(st.Elems)
	}

	var took []time.Duration
	var compile time.Duration
	for b.Loop() {
		for i := range 50 {
			p := s.Pods[i*3] // a local pod, in or out of every set its role is in
			role := fmt.Sprintf("r%d", (i*3)%7)
			if p.Labels["role"] == role {
				role = "none"
			}
			p.Labels = map[string]string{"app": p.Labels["app"], "role": role}
			start := time.Now()
			r := Compile(s)
			compile += time.Since(start)
			ch, err := tb.Sync(r.Ruleset, false)
			took = append(took, time.Since(start))
			if err != nil || ch.Clean() {
				b.Fatalf("Sync after a label change: %+v, %v", ch, err)
			}
		}
	}
	slices.Sort(took)
	b.ReportMetric(float64(took[len(took)/2].Microseconds())/1000, "change-p50-ms")
	b.ReportMetric(float64(took[len(took)*99/100].Microseconds())/1000, "change-p99-ms")
	b.ReportMetric(float64(compile.Microseconds())/1000/float64(len(took)), "compile-ms")
	b.ReportMetric(float64(rules), "rules")
	b.ReportMetric(float64(elems), "set-elements")
}
