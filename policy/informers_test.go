package policy

import (
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestPertinentUpdates: an update that changes nothing Compile reads (a
// pod's conditions, a deletion while it still holds its address, a
// namespace's annotations) does not recompile; one that does (labels, an
// address, a named port, the node) does.
func TestPertinentUpdates(t *testing.T) {
	pod := func(change func(*corev1.Pod)) any {
		p := testPod("x", "a", "n1", "10.244.1.2", map[string]string{"app": "a"}, corev1.ContainerPort{Name: "web", ContainerPort: 80})
		p.ResourceVersion = "1"
		p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionFalse}}
		if change != nil {
			change(p)
		}
		out, _ := recordPod("n1")(p)
		return out
	}
	now := metav1.NewTime(time.Unix(1, 0))
	for _, tc := range []struct {
		what   string
		change func(*corev1.Pod)
		want   bool
	}{
		{"a condition and the resource version", func(p *corev1.Pod) {
			p.ResourceVersion = "2"
			p.Status.Conditions[0].Status = corev1.ConditionTrue
		}, false},
		{"a label", func(p *corev1.Pod) { p.Labels = map[string]string{"app": "b"} }, true},
		{"the address", func(p *corev1.Pod) { p.Status.PodIPs = []corev1.PodIP{{IP: "10.244.1.9"}} }, true},
		{"a deletion, the address still held", func(p *corev1.Pod) { p.DeletionTimestamp = &now }, false},
		{"a deletion, the address gone", func(p *corev1.Pod) {
			p.DeletionTimestamp = &now
			p.Status.PodIP, p.Status.PodIPs = "", nil
		}, true},
		{"the address, not yet given", func(p *corev1.Pod) { p.Status.PodIP, p.Status.PodIPs = "", nil }, true},
		{"the node", func(p *corev1.Pod) { p.Spec.NodeName = "n2" }, true},
		{"a named port", func(p *corev1.Pod) { p.Spec.Containers[0].Ports[0].ContainerPort = 8080 }, true},
		{"the phase", func(p *corev1.Pod) { p.Status.Phase = corev1.PodSucceeded }, true},
	} {
		if got := pertinent(pod(nil), pod(tc.change)); got != tc.want {
			t.Errorf("pod update changing %s: pertinent = %v, want %v", tc.what, got, tc.want)
		}
	}
	ns := func(labels, annotations map[string]string) any {
		return &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "x", Labels: labels, Annotations: annotations}}
	}
	if pertinent(ns(map[string]string{"t": "1"}, nil), ns(map[string]string{"t": "1"}, map[string]string{"note": "x"})) {
		t.Error("a namespace's annotation change recompiles")
	}
	if !pertinent(ns(map[string]string{"t": "1"}, nil), ns(map[string]string{"t": "2"}, nil)) {
		t.Error("a namespace's label change does not recompile")
	}
}
