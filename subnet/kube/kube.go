// Package kube is the Kubernetes subnet manager: a client-go informer on
// Nodes turns each node's spec.podCIDR(s) and twill's annotations into a
// lease. The local node's lease is the podCIDR kube-controller-manager
// assigned it; twilld publishes its backend attributes as annotations on
// its own Node and sets the NetworkUnavailable condition to False once the
// node is ready.
package kube

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
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
		// The first list's last event can reach touched before the
		// informer counts itself synced, so a wait for HasSynced woken by
		// events alone could sleep on: poke once it is synced.
		go func() {
			if cache.WaitForCacheSync(ctx.Done(), m.informer.HasSynced) {
				m.poke()
			}
		}()
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

// ErrNodeGone is returned by Run when the local Node is deleted or its
// podCIDR changes: the lease is gone, and the daemon must start over.
var ErrNodeGone = fmt.Errorf("the local Node or its podCIDR changed: %w", subnet.ErrLeaseGone)

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

// NodeName is the local Node's name.
func (m *Manager) NodeName() string { return m.o.NodeName }
