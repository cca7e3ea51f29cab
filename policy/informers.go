package policy

import (
	"context"
	"maps"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"

	kubesm "github.com/twill-net/twill/subnet/kube"
)

// Informers is the Source for a cluster: informers on pods, namespaces
// and networkpolicies, which need list and watch on each and nothing more.
type Informers struct {
	pods, namespaces, policies cache.SharedIndexInformer
}

var _ Source = (*Informers)(nil)

// NewInformers returns informers reading through cfg, in protobuf.
func NewInformers(cfg *rest.Config) (*Informers, error) {
	core, err := restFor(cfg, "/api", corev1.SchemeGroupVersion, corev1.AddToScheme)
	if err != nil {
		return nil, err
	}
	netw, err := restFor(cfg, "/apis", networkingv1.SchemeGroupVersion, networkingv1.AddToScheme)
	if err != nil {
		return nil, err
	}
	return &Informers{
		pods:       cache.NewSharedIndexInformer(core.listWatch("pods", &corev1.PodList{}), &corev1.Pod{}, 0, cache.Indexers{}),
		namespaces: cache.NewSharedIndexInformer(core.listWatch("namespaces", &corev1.NamespaceList{}), &corev1.Namespace{}, 0, cache.Indexers{}),
		policies:   cache.NewSharedIndexInformer(netw.listWatch("networkpolicies", &networkingv1.NetworkPolicyList{}), &networkingv1.NetworkPolicy{}, 0, cache.Indexers{}),
	}, nil
}

type restGroup struct {
	rc     *rest.RESTClient
	params runtime.ParameterCodec
}

func restFor(cfg *rest.Config, path string, gv schema.GroupVersion, add func(*runtime.Scheme) error) (*restGroup, error) {
	rc, params, err := kubesm.ProtobufClient(cfg, path, gv, add)
	if err != nil {
		return nil, err
	}
	return &restGroup{rc: rc, params: params}, nil
}

func (g *restGroup) listWatch(resource string, list runtime.Object) *cache.ListWatch {
	return &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) {
			out := list.DeepCopyObject()
			err := g.rc.Get().Resource(resource).VersionedParams(&opts, g.params).Do(ctx).Into(out)
			return out, err
		},
		WatchFuncWithContext: func(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
			opts.Watch = true
			return g.rc.Get().Resource(resource).VersionedParams(&opts, g.params).Watch(ctx)
		},
	}
}

// Start runs the informers; every add, update and delete calls changed.
func (i *Informers) Start(ctx context.Context, changed func()) <-chan struct{} {
	h := cache.ResourceEventHandlerFuncs{
		AddFunc: func(any) { changed() },
		UpdateFunc: func(old, new any) {
			if pertinent(old, new) {
				changed()
			}
		},
		DeleteFunc: func(any) { changed() },
	}
	_ = i.pods.SetTransform(stripPod)
	for _, inf := range []cache.SharedIndexInformer{i.pods, i.namespaces, i.policies} {
		_, _ = inf.AddEventHandler(h)
		go inf.RunWithContext(ctx)
	}
	synced := make(chan struct{})
	go func() {
		if cache.WaitForCacheSync(ctx.Done(), i.pods.HasSynced, i.namespaces.HasSynced, i.policies.HasSynced) {
			close(synced)
		}
	}()
	return synced
}

// pertinent says whether an update changed what Compile reads: a pod's
// status written for a condition or a container's restart, or a
// namespace's annotations other than LogAllowedAnnotation, change nothing
// in the table, and at 1,000 pods
// a Compile is not free.
func pertinent(old, new any) bool {
	switch n := new.(type) {
	case *corev1.Pod:
		o, ok := old.(*corev1.Pod)
		if !ok {
			return true
		}
		a, b := *o, *n // stripped: small
		a.ResourceVersion, b.ResourceVersion = "", ""
		return !equality.Semantic.DeepEqual(&a, &b)
	case *corev1.Namespace:
		o, ok := old.(*corev1.Namespace)
		return !ok || !maps.Equal(o.Labels, n.Labels) || o.Annotations[LogAllowedAnnotation] != n.Annotations[LogAllowedAnnotation]
	}
	return true
}

// stripPod keeps what Compile reads, so that a cluster's pods cost the
// informer little memory.
func stripPod(obj any) (any, error) {
	p, ok := obj.(*corev1.Pod)
	if !ok {
		return obj, nil
	}
	out := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: p.Name, Namespace: p.Namespace, Labels: p.Labels,
		ResourceVersion: p.ResourceVersion, DeletionTimestamp: p.DeletionTimestamp},
		Spec:   corev1.PodSpec{NodeName: p.Spec.NodeName, HostNetwork: p.Spec.HostNetwork},
		Status: corev1.PodStatus{Phase: p.Status.Phase, PodIP: p.Status.PodIP, PodIPs: p.Status.PodIPs}}
	for _, c := range p.Spec.Containers {
		var ports []corev1.ContainerPort
		for _, cp := range c.Ports {
			if cp.Name != "" {
				ports = append(ports, corev1.ContainerPort{Name: cp.Name, ContainerPort: cp.ContainerPort, Protocol: cp.Protocol})
			}
		}
		if ports != nil {
			out.Spec.Containers = append(out.Spec.Containers, corev1.Container{Ports: ports})
		}
	}
	return out, nil
}

// Snapshot is the informers' current state.
func (i *Informers) Snapshot() Snapshot {
	var s Snapshot
	for _, o := range i.pods.GetStore().List() {
		s.Pods = append(s.Pods, o.(*corev1.Pod))
	}
	for _, o := range i.namespaces.GetStore().List() {
		s.Namespaces = append(s.Namespaces, o.(*corev1.Namespace))
	}
	for _, o := range i.policies.GetStore().List() {
		s.Policies = append(s.Policies, o.(*networkingv1.NetworkPolicy))
	}
	return s
}
