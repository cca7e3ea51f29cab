package kube

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/twill-net/twill/subnet"
)

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
	lease := subnet.Lease{Subnet: v4, IPv6Subnet: v6, Since: since(node)}
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
		if err := fitFamily(node, "IPv4", "Network", cfg.Network, v4); err != nil {
			return err
		}
		cfg.SubnetLen, cfg.SubnetMin, cfg.SubnetMax = v4.Bits(), netip.Addr{}, netip.Addr{}
	}
	if cfg.EnableIPv6 {
		if err := fitFamily(node, "IPv6", "IPv6Network", cfg.IPv6Network, v6); err != nil {
			return err
		}
		cfg.IPv6SubnetLen, cfg.IPv6SubnetMin, cfg.IPv6SubnetMax = v6.Bits(), netip.Addr{}, netip.Addr{}
	}
	return nil
}

// fitFamily checks a node's podCIDR of one family (invalid: it has none)
// against net-conf.json's network of that family, named field.
func fitFamily(node, family, field string, network, pod netip.Prefix) error {
	if !pod.IsValid() {
		return fmt.Errorf("node %q: spec.podCIDRs has no %s CIDR, but net-conf.json enables %s (%s %s)", node, family, family, field, network)
	}
	if !network.Contains(pod.Addr()) || pod.Bits() < network.Bits() {
		return fmt.Errorf("node %q: spec.podCIDR %s: not inside net-conf.json %s %s (it must match kube-controller-manager --cluster-cidr)", node, pod, field, network)
	}
	return nil
}

func (m *Manager) patchAnnotations(ctx context.Context, want map[string]string) error {
	return m.patchStatus(ctx, types.MergePatchType,
		map[string]any{"metadata": map[string]any{"annotations": want}}, "publishing annotations")
}

// patchStatus patches this node through the status subresource: the
// ClusterRole grants nodes/status patch, not nodes patch, so twilld cannot
// touch a node's spec.
func (m *Manager) patchStatus(ctx context.Context, pt types.PatchType, body any, what string) error {
	patch, err := json.Marshal(body)
	if err != nil {
		return fmt.Errorf("%s on node %q: %w", what, m.o.NodeName, err)
	}
	if _, err := m.o.Client.PatchNodeStatus(ctx, m.o.NodeName, pt, patch); err != nil {
		return fmt.Errorf("%s on node %q: %w", what, m.o.NodeName, err)
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
	// Strategic merge: conditions merge by type, so kubelet's stay.
	return m.patchStatus(ctx, types.StrategicMergePatchType,
		map[string]any{"status": map[string]any{"conditions": cond}}, "setting NetworkUnavailable=False")
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
//
// The new data is what Run keeps from before the patch is sent: the watch
// may bring the patch back before the call returns, and Run, still
// keeping the old data, took it for someone else's change and published
// the old data again (on a key rotation, the peers took the old key back
// for a moment). Should the patch fail, Run publishes the new data.
func (m *Manager) UpdateBackendData(ctx context.Context, data, v6Data json.RawMessage) error {
	rv := ""
	if n, ok := m.self(); ok {
		rv = n.ResourceVersion
	}
	m.mu.Lock()
	attrs := m.lease.Attrs
	attrs.BackendData, attrs.BackendV6Data = data, v6Data
	want := m.ann.Publish(attrs)
	m.published, m.lease.Attrs, m.staleRV = want, attrs, rv
	m.mu.Unlock()
	return m.patchAnnotations(ctx, want)
}
