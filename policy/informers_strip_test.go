package policy

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// A Node in the informer keeps what a nodes peer and the status writer
// read (labels, pod CIDRs, addresses, Ready) and drops the rest (images,
// the other conditions' heartbeats).
func TestStripNodeKeepsWhatPoliciesRead(t *testing.T) {
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1", Labels: map[string]string{"zone": "a"}, Annotations: map[string]string{"big": "x"}},
		Spec: corev1.NodeSpec{PodCIDR: "10.244.1.0/24", PodCIDRs: []string{"10.244.1.0/24"}},
		Status: corev1.NodeStatus{Addresses: []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "192.168.0.1"}},
			Images: []corev1.ContainerImage{{Names: []string{"pause"}}},
			Conditions: []corev1.NodeCondition{{Type: corev1.NodeMemoryPressure, Status: corev1.ConditionFalse},
				{Type: corev1.NodeReady, Status: corev1.ConditionTrue, LastHeartbeatTime: metav1.Now()}}}}
	out, err := stripNode(n)
	if err != nil {
		t.Fatal(err)
	}
	s := out.(*corev1.Node)
	if s.Name != "n1" || s.Labels["zone"] != "a" || s.Spec.PodCIDRs[0] != "10.244.1.0/24" || s.Status.Addresses[0].Address != "192.168.0.1" {
		t.Errorf("stripped node lost what policies read: %+v", s)
	}
	if len(s.Annotations) != 0 || len(s.Status.Images) != 0 || len(s.Status.Conditions) != 1 ||
		s.Status.Conditions[0].Type != corev1.NodeReady || !s.Status.Conditions[0].LastHeartbeatTime.IsZero() {
		t.Errorf("stripped node kept more than it needs: %+v", s)
	}
	if other, _ := stripNode("not a node"); other != "not a node" {
		t.Errorf("stripNode of another object changed it: %v", other)
	}
}

// A ClusterNetworkPolicy twilld cannot read is a problem of its own,
// named, and not enforced; the others are read.
func TestDecodeClusterPoliciesNamesTheUnreadable(t *testing.T) {
	good := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "policy.networking.k8s.io/v1alpha2", "kind": "ClusterNetworkPolicy",
		"metadata": map[string]any{"name": "good"}, "spec": map[string]any{"tier": "Admin", "priority": int64(5),
			"subject": map[string]any{"namespaces": map[string]any{}}}}}
	bad := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "policy.networking.k8s.io/v1alpha2", "kind": "ClusterNetworkPolicy",
		"metadata": map[string]any{"name": "bad"}, "spec": map[string]any{"tier": "Admin", "priority": "high"}}}
	var i Informers
	out, problems := i.decodeClusterPolicies([]any{good, bad, "not an object"})
	if len(out) != 1 || out[0].Name != "good" {
		t.Errorf("decoded %v, want good alone", out)
	}
	if len(problems) != 1 || problems[0].Policy != ClusterPolicyPrefix+"bad" || !strings.Contains(problems[0].Err.Error(), "not enforced") {
		t.Errorf("problems %+v, want bad's, saying it is not enforced", problems)
	}
	// The same objects again: read once, the same policy.
	again, problems := i.decodeClusterPolicies([]any{good, bad})
	if len(again) != 1 || again[0] != out[0] || len(problems) != 1 {
		t.Errorf("the same objects decoded again: %v (%v), want the same policy, and bad's problem", again, problems)
	}
}
