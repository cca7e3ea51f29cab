package policy

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"

	"github.com/twill-net/twill/policy/cnpapi"
	kubesm "github.com/twill-net/twill/subnet/kube"
)

// Informers is the Source for a cluster: informers on pods, namespaces,
// networkpolicies, nodes and clusternetworkpolicies, which need list and
// watch on each and nothing more.
type Informers struct {
	pods, namespaces, policies, nodes, clusterPolicies cache.SharedIndexInformer
	node                                               string // whose pods are local

	mu      sync.Mutex // guards decoded
	decoded map[*unstructured.Unstructured]decoded
}

// decoded is a ClusterNetworkPolicy object as Decode read it: the
// informer's objects are not changed in place, so it is read once.
type decoded struct {
	p   *cnpapi.ClusterNetworkPolicy
	err error
}

var _ Source = (*Informers)(nil)

// NewInformers returns informers reading through cfg, in protobuf; node
// names the node whose pods are local.
func NewInformers(cfg *rest.Config, node string) (*Informers, error) {
	core, err := restFor(cfg, "/api", corev1.SchemeGroupVersion, corev1.AddToScheme)
	if err != nil {
		return nil, err
	}
	netw, err := restFor(cfg, "/apis", networkingv1.SchemeGroupVersion, networkingv1.AddToScheme)
	if err != nil {
		return nil, err
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("a client for ClusterNetworkPolicies: %w", err)
	}
	return &Informers{node: node,
		pods:            cache.NewSharedIndexInformer(core.listWatch("pods", &corev1.PodList{}), &corev1.Pod{}, 0, cache.Indexers{}),
		namespaces:      cache.NewSharedIndexInformer(core.listWatch("namespaces", &corev1.NamespaceList{}), &corev1.Namespace{}, 0, cache.Indexers{}),
		policies:        cache.NewSharedIndexInformer(netw.listWatch("networkpolicies", &networkingv1.NetworkPolicyList{}), &networkingv1.NetworkPolicy{}, 0, cache.Indexers{}),
		nodes:           cache.NewSharedIndexInformer(core.listWatch("nodes", &corev1.NodeList{}), &corev1.Node{}, 0, cache.Indexers{}),
		clusterPolicies: cache.NewSharedIndexInformer(clusterPolicyListWatch(dyn), &unstructured.Unstructured{}, 0, cache.Indexers{}),
	}, nil
}

// CRDRecheck is how often twilld asks again for ClusterNetworkPolicies
// while their CRD is not installed: a CRD installed later is read within
// it.
const CRDRecheck = 30 * time.Second

// clusterPolicyListWatch lists and watches ClusterNetworkPolicies. While
// their CRD is not installed (the apiserver answers 404), it lists none
// and its watch ends after CRDRecheck, so that policy is enforced without
// them and picks them up once installed.
func clusterPolicyListWatch(dyn dynamic.Interface) cache.ListerWatcher {
	res := dyn.Resource(cnpapi.GroupVersionResource)
	lw := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) {
			l, err := res.List(ctx, opts)
			if apierrors.IsNotFound(err) {
				return &unstructured.UnstructuredList{Object: map[string]any{"apiVersion": cnpapi.Group + "/" + cnpapi.Version, "kind": cnpapi.Kind + "List"}}, nil
			}
			return l, err
		},
		WatchFuncWithContext: func(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
			w, err := res.Watch(ctx, opts)
			if apierrors.IsNotFound(err) {
				return endsAfter(ctx, CRDRecheck), nil
			}
			return w, err
		},
	}
	// Lists and watches, not a watch-list: the 404 answer is a list's.
	return cache.ToListWatcherWithWatchListSemantics(lw, noWatchList{})
}

type noWatchList struct{}

func (noWatchList) IsWatchListSemanticsUnSupported() bool { return true }

// endsAfter is a watch with no events that ends after d.
func endsAfter(ctx context.Context, d time.Duration) watch.Interface {
	w := watch.NewFake()
	go func() {
		select {
		case <-ctx.Done():
		case <-time.After(d):
		}
		w.Stop()
	}()
	return w
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
	_ = i.pods.SetTransform(recordPod(i.node))
	_ = i.nodes.SetTransform(stripNode)
	for _, inf := range []cache.SharedIndexInformer{i.pods, i.namespaces, i.policies, i.nodes, i.clusterPolicies} {
		_, _ = inf.AddEventHandler(h)
		go inf.RunWithContext(ctx)
	}
	synced := make(chan struct{})
	go func() {
		if cache.WaitForCacheSync(ctx.Done(), i.pods.HasSynced, i.namespaces.HasSynced, i.policies.HasSynced, i.nodes.HasSynced, i.clusterPolicies.HasSynced) {
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
	case *podRecord:
		o, ok := old.(*podRecord)
		return !ok || !sameRecord(o, n)
	case *corev1.Namespace:
		o, ok := old.(*corev1.Namespace)
		return !ok || !maps.Equal(o.Labels, n.Labels) || o.Annotations[LogAllowedAnnotation] != n.Annotations[LogAllowedAnnotation]
	case *corev1.Node:
		o, ok := old.(*corev1.Node)
		return !ok || !maps.Equal(o.Labels, n.Labels) || !slices.Equal(o.Status.Addresses, n.Status.Addresses) ||
			!slices.Equal(o.Status.Conditions, n.Status.Conditions)
	case *unstructured.Unstructured:
		o, ok := old.(*unstructured.Unstructured)
		// A status written (by twilld itself) changes no rule.
		return !ok || o.GetGeneration() != n.GetGeneration() || !equality.Semantic.DeepEqual(o.Object["spec"], n.Object["spec"])
	}
	return true
}

// stripNode keeps what a nodes peer reads (labels and addresses) and
// whether the node is Ready (ClusterStatus's pick of a writer), without
// the heartbeat's times.
func stripNode(obj any) (any, error) {
	n, ok := obj.(*corev1.Node)
	if !ok {
		return obj, nil
	}
	out := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n.Name, Labels: n.Labels, ResourceVersion: n.ResourceVersion},
		Spec: corev1.NodeSpec{PodCIDR: n.Spec.PodCIDR, PodCIDRs: n.Spec.PodCIDRs}, Status: corev1.NodeStatus{Addresses: n.Status.Addresses}}
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			out.Status.Conditions = []corev1.NodeCondition{{Type: c.Type, Status: c.Status}}
		}
	}
	return out, nil
}

// Snapshot is the informers' current state.
func (i *Informers) Snapshot() Snapshot {
	var s Snapshot
	for _, o := range i.pods.GetStore().List() {
		switch p := o.(type) {
		case *podRecord:
			s.podRecords = append(s.podRecords, p)
		case *corev1.Pod: // not transformed: never seen, but read all the same
			r, _ := recordPod(i.node)(p)
			s.podRecords = append(s.podRecords, r.(*podRecord))
		}
	}
	for _, o := range i.namespaces.GetStore().List() {
		s.Namespaces = append(s.Namespaces, o.(*corev1.Namespace))
	}
	for _, o := range i.policies.GetStore().List() {
		s.Policies = append(s.Policies, o.(*networkingv1.NetworkPolicy))
	}
	for _, o := range i.nodes.GetStore().List() {
		s.Nodes = append(s.Nodes, o.(*corev1.Node))
	}
	s.ClusterPolicies, s.ClusterPolicyErrors = i.decodeClusterPolicies(i.clusterPolicies.GetStore().List())
	return s
}

// decodeClusterPolicies reads the informer's objects; one it cannot read
// is a problem of its own (and enforced not at all).
func (i *Informers) decodeClusterPolicies(objs []any) (out []*cnpapi.ClusterNetworkPolicy, problems []Problem) {
	i.mu.Lock()
	defer i.mu.Unlock()
	next := make(map[*unstructured.Unstructured]decoded, len(objs))
	for _, o := range objs {
		u, ok := o.(*unstructured.Unstructured)
		if !ok {
			continue
		}
		d, ok := i.decoded[u]
		if !ok {
			d.p, d.err = cnpapi.Decode(u.Object)
		}
		next[u] = d
		p, err := d.p, d.err
		if err != nil {
			problems = append(problems, Problem{ClusterPolicyPrefix + u.GetName(), fmt.Errorf("%w: the policy is not enforced", err)})
			continue
		}
		out = append(out, p)
	}
	i.decoded = next
	return out, problems
}
