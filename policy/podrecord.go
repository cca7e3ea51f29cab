package policy

import (
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// podRecord is what the pod informer keeps of a pod: its name and
// resource version, and what Compile reads of it, read once as it came
// (podOf). A *corev1.Pod stripped to those fields took 1.7 KB (the Pod
// struct alone is 1.2 KB, a container with its ports 0.4 KB), and podOf's
// reading of it another 0.6 KB: 23 MiB of twilld's heap at 10,000 pods.
type podRecord struct {
	metav1.ObjectMeta      // Name, Namespace and ResourceVersion: the informer's key
	pod               *pod // podOf's: nil for a pod that policy does not apply to
	// waiting: a pod of the node, on the pod network, without an address
	// yet; while one waits, Compile takes no allocated address for
	// unmanaged (it may be that pod's).
	waiting bool
}

// recordPod is the pod informer's transform for node: a pod becomes its
// podRecord; anything else (a record already, a deleted object's
// tombstone) passes as it is.
func recordPod(node string) func(any) (any, error) {
	return func(obj any) (any, error) {
		p, ok := obj.(*corev1.Pod)
		if !ok {
			return obj, nil
		}
		return &podRecord{ObjectMeta: metav1.ObjectMeta{Name: p.Name, Namespace: p.Namespace, ResourceVersion: p.ResourceVersion},
			pod: podOf(p, node), waiting: waitsForAddress(p, node)}, nil
	}
}

// waitsForAddress says whether p is a pod of node, on the pod network,
// not finished nor deleted, without an address yet.
func waitsForAddress(p *corev1.Pod, node string) bool {
	return p.Spec.NodeName == node && !p.Spec.HostNetwork && len(p.Status.PodIPs) == 0 && p.Status.PodIP == "" &&
		p.Status.Phase != corev1.PodSucceeded && p.Status.Phase != corev1.PodFailed && p.DeletionTimestamp == nil
}

// sameRecord says whether two records of a pod read the same for Compile.
func sameRecord(a, b *podRecord) bool {
	if a.waiting != b.waiting || (a.pod == nil) != (b.pod == nil) {
		return false
	}
	return a.pod == nil || samePod(a.pod, b.pod)
}
