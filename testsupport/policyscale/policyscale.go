// Package policyscale builds the ClusterNetworkPolicies of the policy
// benchmarks' cluster, for the policy package's benchmarks and the e2e
// ones alike.
package policyscale

import (
	"fmt"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/twill-net/twill/policy/cnpapi"
)

// ClusterPolicies is n ClusterNetworkPolicies for the benchmarks' cluster
// (namespaces ns0–ns9 labelled tier 0–2, pods labelled app0–app49 and
// r0–r6, a port named http on 80): the first half of the Admin tier, the
// rest of the Baseline tier, priorities 0 up in each. Admin policies
// select whole namespaces by tier and carry a Deny, an Accept, a Pass and
// two egress rules each; Baseline ones select one app's pods. None of them
// decides a connection from a namespace's own pods to its pods on port 80,
// which the benchmarks' NetworkPolicies allow: those packets walk the
// Admin tier to its end and reach NetworkPolicy.
func ClusterPolicies(n int) []*cnpapi.ClusterNetworkPolicy {
	out := make([]*cnpapi.ClusterNetworkPolicy, 0, n)
	for i := range n {
		if i < n/2 {
			out = append(out, admin(i))
		} else {
			out = append(out, baseline(i-n/2))
		}
	}
	return out
}

func admin(i int) *cnpapi.ClusterNetworkPolicy {
	tier := func(k int) *metav1.LabelSelector {
		return &metav1.LabelSelector{MatchLabels: map[string]string{"tier": fmt.Sprint(k % 3)}}
	}
	return &cnpapi.ClusterNetworkPolicy{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("admin%d", i)},
		Spec: cnpapi.Spec{Tier: cnpapi.Admin, Priority: int32(i), Subject: cnpapi.Subject{Namespaces: tier(i)},
			Ingress: []cnpapi.IngressRule{
				{Name: "quarantine", Action: cnpapi.Deny, From: []cnpapi.IngressPeer{{Namespaces: &metav1.LabelSelector{
					MatchLabels: map[string]string{"quarantine": "true"}}}}},
				{Name: "scrape", Action: cnpapi.Accept, Protocols: []cnpapi.Protocol{tcp(9000 + int32(i))},
					From: []cnpapi.IngressPeer{{Pods: &cnpapi.NamespacedPod{NamespaceSelector: *tier(i + 1),
						PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"role": fmt.Sprintf("r%d", i%7)}}}}}},
				{Name: "delegate", Action: cnpapi.Pass, From: []cnpapi.IngressPeer{{Namespaces: tier(i + 2)}}},
			},
			Egress: []cnpapi.EgressRule{
				{Name: "metadata", Action: cnpapi.Deny, To: []cnpapi.EgressPeer{{Networks: []string{"169.254.169.254/32"}}}},
				{Name: "backends", Action: cnpapi.Accept, Protocols: []cnpapi.Protocol{tcp(8080)},
					To: []cnpapi.EgressPeer{{Pods: &cnpapi.NamespacedPod{
						PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"role": fmt.Sprintf("r%d", (i+3)%7)}}}}}},
			}}}
}

func baseline(i int) *cnpapi.ClusterNetworkPolicy {
	return &cnpapi.ClusterNetworkPolicy{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("baseline%d", i)},
		Spec: cnpapi.Spec{Tier: cnpapi.Baseline, Priority: int32(i),
			Subject: cnpapi.Subject{Pods: &cnpapi.NamespacedPod{
				PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": fmt.Sprintf("app%d", i%50)}}}},
			Ingress: []cnpapi.IngressRule{{Action: cnpapi.Deny, From: []cnpapi.IngressPeer{{Namespaces: &metav1.LabelSelector{
				MatchLabels: map[string]string{"tier": fmt.Sprint((i + 1) % 3)}}}}}},
			Egress: []cnpapi.EgressRule{{Action: cnpapi.Deny, Protocols: []cnpapi.Protocol{tcp(22)},
				To: []cnpapi.EgressPeer{{Networks: []string{"192.168.0.0/16"}}}}},
		}}
}

func tcp(port int32) cnpapi.Protocol {
	return cnpapi.Protocol{TCP: &cnpapi.PortMatch{DestinationPort: &cnpapi.Port{Number: port}}}
}
