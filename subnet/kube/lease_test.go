package kube

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"maps"
	"net/netip"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/twill-net/twill/subnet"
)

// listClient serves a fixed list of Nodes, a watch that stays quiet, and
// accepts every patch.
type listClient struct{ nodes []corev1.Node }

func (c listClient) ListNodes(context.Context, metav1.ListOptions) (*corev1.NodeList, error) {
	return &corev1.NodeList{ListMeta: metav1.ListMeta{ResourceVersion: "1"}, Items: c.nodes}, nil
}

func (c listClient) WatchNodes(_ context.Context, opts metav1.ListOptions) (watch.Interface, error) {
	if opts.SendInitialEvents != nil {
		return nil, errors.New("streaming lists not served")
	}
	return watch.NewFake(), nil
}

func (c listClient) PatchNodeStatus(_ context.Context, name string, _ types.PatchType, _ []byte) (*corev1.Node, error) {
	for i := range c.nodes {
		if c.nodes[i].Name == name {
			return &c.nodes[i], nil
		}
	}
	return nil, errors.New("no such node")
}

func (c listClient) GetPod(context.Context, string, string) (*corev1.Pod, error) {
	return nil, errors.New("no pods")
}

// TestAcquireLeaseOnFirstSync: the lease is taken as soon as the informer
// has the first list, not at the next wait report. The last event of the
// first list can reach the manager before the informer counts itself
// synced; a wait that listened only for events then slept until the
// report (10 s by default: a twilld that took 10 s to start, seen under
// load in the e2e tier).
func TestAcquireLeaseOnFirstSync(t *testing.T) {
	nodes := []corev1.Node{*node("n1", "10.244.1.0/24", "10.0.0.1", nil), *node("n2", "10.244.2.0/24", "10.0.0.2", nil),
		*node("n3", "10.244.3.0/24", "10.0.0.3", nil)}
	var slow int
	for range 200 {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		m := New(Options{Client: listClient{nodes: nodes}, NodeName: "n3", Annotations: ann(t),
			Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), WaitReport: time.Hour})
		cfg := &subnet.Config{Network: netip.MustParsePrefix("10.244.0.0/16"), EnableIPv4: true, BackendType: "host-gw"}
		lease, err := m.AcquireLease(ctx, cfg, subnet.LeaseAttrs{PublicIP: netip.MustParseAddr("10.0.0.3"), BackendType: "host-gw"}, subnet.Lease{})
		cancel()
		if errors.Is(err, context.DeadlineExceeded) {
			slow++
			continue
		}
		if err != nil || lease.Subnet.String() != "10.244.3.0/24" {
			t.Fatalf("AcquireLease: %v, %v", lease, err)
		}
	}
	if slow > 0 {
		t.Fatalf("%d of 200 AcquireLease calls still waited after 3 s, with the first list in the informer", slow)
	}
}

// hookClient is listClient with a hook on each patch.
type hookClient struct {
	listClient
	hook func(patch []byte)
}

func (c hookClient) PatchNodeStatus(ctx context.Context, name string, pt types.PatchType, patch []byte) (*corev1.Node, error) {
	c.hook(patch)
	return c.listClient.PatchNodeStatus(ctx, name, pt, patch)
}

// TestUpdateBackendDataKeepsTheNewDataOnly: the watch brings the node's
// own patch back before UpdateBackendData returns (a key rotation under
// load); Run's repair must not take it for someone else's change and
// publish the old data again, or the peers take the old key back.
func TestUpdateBackendDataKeepsTheNewDataOnly(t *testing.T) {
	nodes := []corev1.Node{*node("n1", "10.244.1.0/24", "10.0.0.1", nil)}
	var m *Manager
	var patches []string
	echo := true
	c := hookClient{listClient: listClient{nodes: nodes}, hook: func(patch []byte) {
		patches = append(patches, string(patch))
		if m == nil || !echo || !strings.Contains(string(patch), "new-key") {
			return
		}
		echo = false // once: the watch's event for this patch, handled at once
		var body struct {
			Metadata struct{ Annotations map[string]string }
		}
		if err := json.Unmarshal(patch, &body); err != nil {
			t.Error(err)
		}
		n, _ := m.self()
		n = n.DeepCopy()
		maps.Copy(n.Annotations, body.Metadata.Annotations)
		n.ResourceVersion = "2"
		if err := m.informer.GetStore().Update(n); err != nil {
			t.Error(err)
		}
		if err := m.repairSelf(context.Background()); err != nil {
			t.Error(err)
		}
	}}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	mm := New(Options{Client: c, NodeName: "n1", Annotations: ann(t), Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), WaitReport: time.Hour})
	cfg := &subnet.Config{Network: netip.MustParsePrefix("10.244.0.0/16"), EnableIPv4: true, BackendType: "wireguard"}
	if _, err := mm.AcquireLease(ctx, cfg, subnet.LeaseAttrs{PublicIP: netip.MustParseAddr("10.0.0.1"), BackendType: "wireguard",
		BackendData: []byte(`{"PublicKey":"old-key"}`)}, subnet.Lease{}); err != nil {
		t.Fatal(err)
	}
	// The cache holds the first publication, as the watch brought it.
	n, _ := mm.self()
	n = n.DeepCopy()
	n.Annotations = mm.ann.Publish(mm.lease.Attrs)
	n.ResourceVersion = "1"
	if err := mm.informer.GetStore().Update(n); err != nil {
		t.Fatal(err)
	}
	m, patches = mm, nil
	if err := m.UpdateBackendData(ctx, []byte(`{"PublicKey":"new-key"}`), nil); err != nil {
		t.Fatal(err)
	}
	if echo {
		t.Fatal("the patch with the new data was never sent")
	}
	for _, p := range patches {
		if strings.Contains(p, "old-key") {
			t.Fatalf("the old data was published again after the new: patches %q", patches)
		}
	}
}
