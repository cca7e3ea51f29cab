package clusterread

import (
	"context"
	"net/netip"
	"testing"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
)

// Read reads what Explain needs from the apiserver: every Node, pod,
// namespace and NetworkPolicy.
func TestRead(t *testing.T) {
	objs := []runtime.Object{
		&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}},
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "x"}},
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "y"}},
		&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "x", Name: "a"}, Status: corev1.PodStatus{PodIP: netip.MustParseAddr("10.244.1.2").String()}},
		&networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: "y", Name: "deny"}},
	}
	c, err := Read(context.Background(), fake.NewClientset(objs...))
	if err != nil {
		t.Fatal(err)
	}
	if len(c.Nodes) != 1 || len(c.Pods) != 1 || c.Pods[0].Name != "a" || len(c.Namespaces) != 2 || len(c.Policies) != 1 || c.Policies[0].Name != "deny" {
		t.Errorf("Read %d nodes, %d pods, %d namespaces, %d policies; want 1, 1 (x/a), 2, 1 (y/deny)",
			len(c.Nodes), len(c.Pods), len(c.Namespaces), len(c.Policies))
	}
}
