// Package kube is the Kubernetes subnet manager: a client-go informer on
// Nodes turns each node's spec.podCIDR(s) and twill's annotations into a
// lease. The local node's lease is the podCIDR kube-controller-manager
// assigned it; twilld publishes its backend attributes as annotations on
// its own Node and sets the NetworkUnavailable condition to False once the
// node is ready.
package kube

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"

	"github.com/twill-net/twill/internal/backoff"
	"github.com/twill-net/twill/subnet"
)

// ConditionReason is the reason twill gives on NetworkUnavailable=False.
const ConditionReason = "TwillIsUp"

// Options configures a Manager.
type Options struct {
	Client   Client
	NodeName string
	// Annotations names twill's annotations (NewAnnotations).
	Annotations Annotations
	// NetConfPath is net-conf.json, mounted from the ConfigMap.
	NetConfPath string
	Logger      *slog.Logger
	// Resync is how often the informer replays its cache, so that the
	// backend is handed the full node set even if an event was lost
	// (default 30s).
	Resync time.Duration
	// WaitReport is how often the wait for the node's podCIDR is logged
	// (default 10s).
	WaitReport time.Duration
}

// Manager is the Kubernetes subnet manager.
type Manager struct {
	o   Options
	ann Annotations
	log *slog.Logger

	startOnce sync.Once
	informer  cache.SharedIndexInformer
	changed   chan struct{}
	dirty     map[string]struct{} // guarded by mu; nodes changed since the last publish

	mu        sync.Mutex
	published map[string]string // guarded by mu; own annotations as last patched
	staleRV   string            // guarded by mu; the node's resourceVersion before that patch
	lease     subnet.Lease      // guarded by mu
	ready     atomic.Bool
	// lastListErr is the informer's last failed list, for the wait message.
	lastListErr atomic.Value
	// conflicts counts the times someone else changed twill's annotations
	// on this node's Node.
	conflicts atomic.Uint64
}

// New returns a Manager. Nothing talks to the apiserver until
// AcquireLease.
func New(o Options) *Manager {
	if o.Resync <= 0 {
		o.Resync = 30 * time.Second
	}
	if o.WaitReport <= 0 {
		o.WaitReport = 10 * time.Second
	}
	return &Manager{o: o, ann: o.Annotations, log: o.Logger.With("subnet-manager", "kube", "node", o.NodeName), changed: make(chan struct{}, 1)}
}

// NetworkConfig reads net-conf.json from the mounted ConfigMap.
func (m *Manager) NetworkConfig(context.Context) (*subnet.Config, error) {
	data, err := os.ReadFile(m.o.NetConfPath)
	if err != nil {
		return nil, fmt.Errorf("--net-config-path: %w", err)
	}
	cfg, err := subnet.ParseConfig(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", m.o.NetConfPath, err)
	}
	return cfg, nil
}

func (m *Manager) start(ctx context.Context) {
	m.startOnce.Do(func() {
		lw := &cache.ListWatch{
			ListWithContextFunc: func(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) {
				l, err := m.o.Client.ListNodes(ctx, opts)
				if err != nil {
					m.lastListErr.Store(err.Error())
				}
				return l, err
			},
			WatchFuncWithContext: func(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
				w, err := m.o.Client.WatchNodes(ctx, opts)
				if err != nil {
					m.lastListErr.Store(err.Error())
				}
				return w, err
			},
		}
		m.informer = cache.NewSharedIndexInformer(lw, &corev1.Node{}, m.o.Resync, cache.Indexers{})
		_ = m.informer.SetTransform(m.ann.strip)
		_, _ = m.informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
			AddFunc:    m.touched,
			UpdateFunc: func(_, obj any) { m.touched(obj) },
			DeleteFunc: m.touched,
		})
		go m.informer.RunWithContext(ctx)
	})
}

// touched records that a node changed (or went) and pokes.
func (m *Manager) touched(obj any) {
	if name, err := cache.DeletionHandlingMetaNamespaceKeyFunc(obj); err == nil {
		m.mu.Lock()
		if m.dirty == nil {
			m.dirty = map[string]struct{}{}
		}
		m.dirty[name] = struct{}{}
		m.mu.Unlock()
	}
	m.poke()
}

// takeDirty returns the nodes changed since the last call.
func (m *Manager) takeDirty() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	names := make([]string, 0, len(m.dirty))
	for n := range m.dirty {
		names = append(names, n)
	}
	clear(m.dirty)
	return names
}

// poke marks the node set changed; pokes coalesce.
func (m *Manager) poke() {
	select {
	case m.changed <- struct{}{}:
	default:
	}
}

func (m *Manager) self() (*corev1.Node, bool) { return m.node(m.o.NodeName) }

// node is a Node from the informer's cache.
func (m *Manager) node(name string) (*corev1.Node, bool) {
	obj, ok, err := m.informer.GetStore().GetByKey(name)
	if err != nil || !ok {
		return nil, false
	}
	return obj.(*corev1.Node), true
}

// nodes is every Node in the informer's cache.
func (m *Manager) nodes() []*corev1.Node {
	objs := m.informer.GetStore().List()
	nodes := make([]*corev1.Node, 0, len(objs))
	for _, o := range objs {
		nodes = append(nodes, o.(*corev1.Node))
	}
	return nodes
}

// AcquireLease waits until the informer has listed the nodes and the local
// node has a podCIDR, then publishes attrs as the node's annotations. The
// lease is the podCIDR; cfg's subnet lengths are set from it, since in
// Kubernetes kube-controller-manager, not net-conf.json, decides them.
func (m *Manager) AcquireLease(ctx context.Context, cfg *subnet.Config, attrs subnet.LeaseAttrs, _ subnet.Lease) (subnet.Lease, error) {
	m.start(ctx)
	report := time.NewTicker(m.o.WaitReport)
	defer report.Stop()
	began := time.Now()
	var node *corev1.Node
	for {
		if m.informer.HasSynced() {
			if n, ok := m.self(); ok {
				v4, v6, err := PodCIDRs(n)
				if err != nil {
					return subnet.Lease{}, err
				}
				if v4.IsValid() || v6.IsValid() {
					node = n
					break
				}
			}
		}
		select {
		case <-ctx.Done():
			return subnet.Lease{}, ctx.Err()
		case <-m.changed:
		case <-report.C:
			what := "to get a podCIDR (kube-controller-manager assigns it with --allocate-node-cidrs)"
			if !m.informer.HasSynced() {
				what = "for the first list of Nodes from the apiserver"
			} else if _, ok := m.self(); !ok {
				what = "for its Node object to exist (check NODE_NAME)"
			}
			args := []any{"waited", time.Since(began).Round(time.Second)}
			if e, _ := m.lastListErr.Load().(string); e != "" && !m.informer.HasSynced() {
				args = append(args, "last_error", e)
			}
			m.log.Info("waiting "+what, args...)
		}
	}
	v4, v6, _ := PodCIDRs(node)
	lease := subnet.Lease{Subnet: v4, IPv6Subnet: v6}
	if err := fitConfig(cfg, node.Name, v4, v6); err != nil {
		return subnet.Lease{}, err
	}
	if ow := node.Annotations[m.ann.Key(AnnPublicIPOverwrite)]; ow != "" {
		ip, err := parseIP(ow, false)
		if err != nil {
			return subnet.Lease{}, fmt.Errorf("node %q: annotation %s %q: %w", node.Name, m.ann.Key(AnnPublicIPOverwrite), ow, err)
		}
		m.log.Info("publishing the operator's public IP", "annotation", m.ann.Key(AnnPublicIPOverwrite), "public_ip", ip, "detected", attrs.PublicIP)
		attrs.PublicIP = ip
	}
	if ow := node.Annotations[m.ann.Key(AnnPublicIPv6Overwrite)]; ow != "" {
		ip, err := parseIP(ow, true)
		if err != nil {
			return subnet.Lease{}, fmt.Errorf("node %q: annotation %s %q: %w", node.Name, m.ann.Key(AnnPublicIPv6Overwrite), ow, err)
		}
		attrs.PublicIPv6 = ip
	}
	// An address of a family the pods do not use is published only when
	// the node has no other (a vxlan overlay over it): kubelet lists the
	// pods' families in status.addresses, which peers check it against.
	if !cfg.EnableIPv6 {
		attrs.BackendV6Data = nil
		if attrs.PublicIP.IsValid() {
			attrs.PublicIPv6 = netip.Addr{}
		}
	}
	if !cfg.EnableIPv4 && attrs.PublicIPv6.IsValid() {
		attrs.PublicIP = netip.Addr{}
	}
	lease.Attrs = attrs
	want := m.ann.Publish(attrs)
	if err := m.patchAnnotations(ctx, want); err != nil {
		return subnet.Lease{}, err
	}
	m.mu.Lock()
	m.published, m.lease, m.staleRV = want, lease, node.ResourceVersion
	m.mu.Unlock()
	return lease, nil
}

// fitConfig checks the node's podCIDRs against Network and takes the
// subnet lengths from them.
func fitConfig(cfg *subnet.Config, node string, v4, v6 netip.Prefix) error {
	if cfg.EnableIPv4 {
		if !v4.IsValid() {
			return fmt.Errorf("node %q: spec.podCIDRs has no IPv4 CIDR, but net-conf.json enables IPv4 (Network %s)", node, cfg.Network)
		}
		if !cfg.Network.Contains(v4.Addr()) || v4.Bits() < cfg.Network.Bits() {
			return fmt.Errorf("node %q: spec.podCIDR %s: not inside net-conf.json Network %s (it must match kube-controller-manager --cluster-cidr)", node, v4, cfg.Network)
		}
		cfg.SubnetLen = v4.Bits()
		cfg.SubnetMin, cfg.SubnetMax = netip.Addr{}, netip.Addr{}
	}
	if cfg.EnableIPv6 {
		if !v6.IsValid() {
			return fmt.Errorf("node %q: spec.podCIDRs has no IPv6 CIDR, but net-conf.json enables IPv6 (IPv6Network %s)", node, cfg.IPv6Network)
		}
		if !cfg.IPv6Network.Contains(v6.Addr()) || v6.Bits() < cfg.IPv6Network.Bits() {
			return fmt.Errorf("node %q: IPv6 podCIDR %s: not inside net-conf.json IPv6Network %s", node, v6, cfg.IPv6Network)
		}
		cfg.IPv6SubnetLen = v6.Bits()
		cfg.IPv6SubnetMin, cfg.IPv6SubnetMax = netip.Addr{}, netip.Addr{}
	}
	return nil
}

func (m *Manager) patchAnnotations(ctx context.Context, want map[string]string) error {
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": want}})
	if err != nil {
		return err
	}
	// Through the status subresource: the ClusterRole grants nodes/status
	// patch, not nodes patch, so twilld cannot touch a node's spec.
	if _, err := m.o.Client.PatchNodeStatus(ctx, m.o.NodeName, types.MergePatchType, patch); err != nil {
		return fmt.Errorf("publishing annotations on node %q: %w", m.o.NodeName, err)
	}
	return nil
}

// Ready records that the node is ready: Run then keeps the node's
// NetworkUnavailable condition False.
func (m *Manager) Ready(context.Context) error {
	m.ready.Store(true)
	m.poke()
	return nil
}

func (m *Manager) setCondition(ctx context.Context) error {
	now := metav1.Now()
	cond := []corev1.NodeCondition{{
		Type: corev1.NodeNetworkUnavailable, Status: corev1.ConditionFalse, Reason: ConditionReason,
		Message: "twill is running on this node", LastTransitionTime: now, LastHeartbeatTime: now,
	}}
	patch, err := json.Marshal(map[string]any{"status": map[string]any{"conditions": cond}})
	if err != nil {
		return err
	}
	// Strategic merge: conditions merge by type, so kubelet's stay.
	if _, err := m.o.Client.PatchNodeStatus(ctx, m.o.NodeName, types.StrategicMergePatchType, patch); err != nil {
		return fmt.Errorf("setting NetworkUnavailable=False on node %q: %w", m.o.NodeName, err)
	}
	return nil
}

// ErrNodeGone is returned by Run when the local Node is deleted or its
// podCIDR changes: the lease is gone, and the daemon must start over.
var ErrNodeGone = errors.New("the local node's lease is gone")

// Run hands the backend every node's entry at first, then what changed
// (coalesced; the informer's resync replays every node), and keeps the
// local node's annotations and NetworkUnavailable condition as twill set
// them.
func (m *Manager) Run(ctx context.Context, publish func(subnet.Change)) error {
	m.start(ctx)
	if !cache.WaitForCacheSync(ctx.Done(), m.informer.HasSynced) {
		return nil
	}
	var (
		retryAt time.Time
		bo      = backoff.Backoff{Min: 500 * time.Millisecond, Max: 30 * time.Second}
		timer   = time.NewTimer(time.Hour)
	)
	defer timer.Stop()
	set := newNodeSet(m.ann, m.o.NodeName)
	m.takeDirty()
	publish(set.full(m.nodes()))
	m.poke() // check and repair the local Node at once
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-m.changed:
			if c := set.update(m.takeDirty(), m.node, m.nodes); c.Full || len(c.Set)+len(c.Deleted) > 0 {
				publish(c)
			}
		case <-timer.C:
		}

		if err := m.checkSelf(); err != nil {
			return err
		}
		if time.Now().Before(retryAt) {
			continue
		}
		if err := m.repairSelf(ctx); err != nil {
			retryDelay := bo.Next()
			retryAt = time.Now().Add(retryDelay)
			timer.Reset(retryDelay)
			m.log.Warn("updating the local Node failed; retrying", "err", err, "retry_in", retryDelay)
			continue
		}
		bo.Reset()
	}
}

func (m *Manager) checkSelf() error {
	n, ok := m.self()
	m.mu.Lock()
	lease := m.lease
	m.mu.Unlock()
	if !ok {
		return fmt.Errorf("node %q was deleted: %w", m.o.NodeName, ErrNodeGone)
	}
	v4, v6, err := PodCIDRs(n)
	if err != nil || v4 != lease.Subnet || v6 != lease.IPv6Subnet {
		return fmt.Errorf("node %q: podCIDR changed from %s to %s: %w", m.o.NodeName,
			subnet.SubnetKey(lease.Subnet, lease.IPv6Subnet), subnet.SubnetKey(v4, v6), ErrNodeGone)
	}
	return nil
}

// OwnLeaseConflicts is how many times this node's twill annotations were
// found changed by someone else (and published again).
func (m *Manager) OwnLeaseConflicts() uint64 { return m.conflicts.Load() }

// repairSelf re-publishes the annotations if someone changed them, and
// sets NetworkUnavailable=False once ready if it is not.
func (m *Manager) repairSelf(ctx context.Context) error {
	n, _ := m.self()
	m.mu.Lock()
	want, stale := m.published, n.ResourceVersion == m.staleRV
	m.mu.Unlock()
	if stale {
		return nil // the cache has not seen our own patch yet; its event will come
	}
	for k, v := range want {
		if n.Annotations[k] != v {
			m.conflicts.Add(1)
			m.log.Warn("the node's twill annotations were changed; publishing them again", "annotation", k, "found", clip(n.Annotations[k]))
			if err := m.patchAnnotations(ctx, want); err != nil {
				return err
			}
			m.mu.Lock()
			m.staleRV = n.ResourceVersion
			m.mu.Unlock()
			return nil
		}
	}
	if !m.ready.Load() {
		return nil
	}
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeNetworkUnavailable && c.Status == corev1.ConditionFalse {
			return nil
		}
	}
	if err := m.setCondition(ctx); err != nil {
		return err
	}
	m.log.Info("set NetworkUnavailable=False", "reason", ConditionReason)
	return nil
}

// UpdateBackendData publishes new backend data in the node's annotations
// (a backend that had to change it, such as vxlan taking a new VTEP MAC);
// Run keeps it there from then on.
func (m *Manager) UpdateBackendData(ctx context.Context, data, v6Data json.RawMessage) error {
	m.mu.Lock()
	attrs := m.lease.Attrs
	attrs.BackendData, attrs.BackendV6Data = data, v6Data
	want := m.ann.Publish(attrs)
	m.mu.Unlock()
	rv := ""
	if n, ok := m.self(); ok {
		rv = n.ResourceVersion
	}
	if err := m.patchAnnotations(ctx, want); err != nil {
		return err
	}
	m.mu.Lock()
	m.published, m.lease.Attrs, m.staleRV = want, attrs, rv
	m.mu.Unlock()
	return nil
}

// NodeName is the local Node's name.
func (m *Manager) NodeName() string { return m.o.NodeName }
