package e2e

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/twill-net/twill/lab"
)

// clusterTiers (TestKubeNetworkPolicy's lab, with its policies in place:
// b0 takes only role=client pods, a0 is one) checks ClusterNetworkPolicy's
// tiers against NetworkPolicy, with the lab's CRD (build/cnp):
//   - a NetworkPolicy lets the pods labelled cnp=admin-denied or
//     cnp=baseline-denied send anywhere;
//   - an Admin tier Deny stops the first from reaching cnp-target pods
//     all the same, a Baseline tier Deny does not stop the second (the
//     NetworkPolicy decides before it);
//   - both from a pod's first packet, and while node2's twilld restarts;
//   - a Baseline Deny decides for a pod no NetworkPolicy selects;
//   - each policy's status says it is enforced, but the one with a
//     domainNames peer, which says that field is not, as the log does.
func clusterTiers(t *testing.T, s *lab.State, reaches func(from, to lab.Pod) bool, a0, b0, b1 lab.Pod) {
	t.Helper()
	kubectl := labKubectl(t, s)
	if out := kubectl("get", "crd", "clusternetworkpolicies.policy.networking.k8s.io", "-o", "name"); !strings.Contains(out, "clusternetworkpolicies") {
		t.Fatalf("the lab has no ClusterNetworkPolicy CRD (make cnp-tools; lab up --crd): %q", out)
	}
	target := b1
	kubectl("-n", "lab", "label", "pod", target.Name, "cnp-target=yes")
	kubectl("-n", "lab", "label", "pod", b0.Name, "cnp=admin-denied")
	apply(t, s, `apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: send-anywhere, namespace: lab}
spec:
  podSelector: {matchExpressions: [{key: cnp, operator: In, values: [admin-denied, baseline-denied]}]}
  policyTypes: [Egress]
  egress: [{}]
---
apiVersion: policy.networking.k8s.io/v1beta1
kind: ClusterNetworkPolicy
metadata: {name: admin-deny}
spec:
  tier: Admin
  priority: 10
  subject: {pods: {namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: lab}}, podSelector: {matchLabels: {cnp: admin-denied}}}}
  egress:
    - name: not-to-targets
      action: Deny
      to: [{pods: {namespaceSelector: {}, podSelector: {matchLabels: {cnp-target: "yes"}}}}]
---
apiVersion: policy.networking.k8s.io/v1beta1
kind: ClusterNetworkPolicy
metadata: {name: baseline-deny}
spec:
  tier: Baseline
  priority: 10
  subject: {pods: {namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: lab}}, podSelector: {matchLabels: {cnp: baseline-denied}}}}
  egress:
    - action: Deny
      to: [{pods: {namespaceSelector: {}, podSelector: {matchLabels: {cnp-target: "yes"}}}}]
`)
	t.Cleanup(func() {
		if t.Failed() {
			netpolDebug(t, s, s.Nodes[1].Name)
		}
	})
	waitFor(t, 30*time.Second, "b0 (cnp=admin-denied) kept from b1 by the Admin tier's Deny", func() bool { return !reaches(b0, target) })
	// a0 is not the Admin policy's subject; the NetworkPolicy of b0 still
	// lets it in.
	if !reaches(a0, target) || !reaches(a0, b0) {
		t.Errorf("%s lost %s or %s to a ClusterNetworkPolicy that does not select it", a0.Label(), target.Label(), b0.Label())
	}

	labels := [2]string{"cnp: admin-denied", "cnp: baseline-denied"}
	checkProbes(t, s, target, probePods(t, s, target, "cnp-first", 8*time.Second, labels))
	firstPacketAcrossRestart(t, s, target, [2]lab.Pod{b0, target}, "cnp-restart", labels)

	// The Baseline tier decides for a pod no NetworkPolicy selects for
	// ingress: b1 lets a0 in until a Baseline Deny says otherwise.
	apply(t, s, `apiVersion: policy.networking.k8s.io/v1beta1
kind: ClusterNetworkPolicy
metadata: {name: baseline-ingress}
spec:
  tier: Baseline
  priority: 20
  subject: {pods: {namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: lab}}, podSelector: {matchLabels: {cnp-target: "yes"}}}}
  ingress:
    - action: Deny
      from: [{pods: {namespaceSelector: {}, podSelector: {matchLabels: {role: client}}}}]
`)
	waitFor(t, 30*time.Second, "a0 (role=client) kept from b1 by the Baseline tier, no NetworkPolicy isolating b1's ingress", func() bool { return !reaches(a0, target) })

	// Status: one twilld writes each policy's condition.
	apply(t, s, `apiVersion: policy.networking.k8s.io/v1beta1
kind: ClusterNetworkPolicy
metadata: {name: by-name}
spec:
  tier: Admin
  priority: 30
  subject: {namespaces: {matchLabels: {kubernetes.io/metadata.name: lab}}}
  egress:
    - action: Accept
      to: [{domainNames: [example.com]}]
`)
	for _, name := range []string{"admin-deny", "baseline-deny", "baseline-ingress"} {
		waitFor(t, 30*time.Second, name+"'s status saying it is enforced", func() bool {
			return kubectl("get", "clusternetworkpolicy", name, "-o", `jsonpath={.status.conditions[?(@.type=="Accepted")].status}`) == "True"
		})
	}
	var msg string
	waitFor(t, 30*time.Second, "by-name's status naming domainNames", func() bool {
		msg = kubectl("get", "clusternetworkpolicy", "by-name", "-o", `jsonpath={.status.conditions[?(@.type=="Accepted")].status} {.status.conditions[?(@.type=="Accepted")].message}`)
		return strings.HasPrefix(msg, "False ") && strings.Contains(msg, "spec.egress[0].to[0].domainNames")
	})
	t.Logf("by-name's status: %s", msg)
	var logs string
	for _, n := range s.Nodes {
		out, _ := s.Kubectl(context.Background(), nil, "-n", lab.TwillNamespace, "logs", strings.Fields(twillPod(t, s, n.Name))[0], "-c", "kube-twill")
		logs += out
	}
	if !strings.Contains(logs, "spec.egress[0].to[0].domainNames") {
		t.Errorf("no twilld log names spec.egress[0].to[0].domainNames")
	}
}
