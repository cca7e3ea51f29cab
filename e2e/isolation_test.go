package e2e

import (
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
)

// TestKubeNodeIsolation: with dist/kube-twill.yml's admission policy, the
// token of node1's twill pod changes node1's twill annotations and its
// NetworkUnavailable condition, and nothing else: not node2 at all, not
// node1's addresses, labels or other annotations. A token of twill's
// account with no node claim changes nothing. twill itself keeps working.
func TestKubeNodeIsolation(t *testing.T) {
	beside(t)
	k := newKubeCluster(t, 2, "host-gw")
	k.startNodes()
	k.published(0)
	k.published(1)
	node1, node2 := k.topo.Nodes[0].Name, k.topo.Nodes[1].Name

	as := func(tok string) corev1client.NodeInterface {
		c, err := corev1client.NewForConfig(k.api.Config(tok))
		if err != nil {
			t.Fatal(err)
		}
		return c.Nodes()
	}
	twill1 := as(k.api.NodeToken(t, "kube-twill", "twill", node1))
	patch := func(nodes corev1client.NodeInterface, node, body string) error {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, err := nodes.Patch(ctx, node, types.StrategicMergePatchType, []byte(body), metav1.PatchOptions{}, "status")
		return err
	}
	// An admission policy takes effect once the apiserver has read it,
	// a moment after kubectl apply returns.
	waitFor(t, 30*time.Second, "the admission policy in force", func() bool {
		return patch(twill1, node2, `{"metadata":{"annotations":{"twill.io/isolation-probe":"x"}}}`) != nil
	})
	otherAddr := `{"status":{"addresses":[{"type":"InternalIP","address":"10.99.0.250"},{"type":"Hostname","address":"x"}]}}`
	denied := []struct{ what, node, body, want string }{
		{"node2's twill annotations", node2, `{"metadata":{"annotations":{"twill.io/public-ip":"10.99.0.250"}}}`,
			"twill on node " + node1 + " may change only its own Node, not " + node2},
		{"node2's status.addresses", node2, otherAddr, "may change only its own Node"},
		{"node1's status.addresses", node1, otherAddr, "may not change a Node's status.addresses"},
		{"node1's other annotations", node1, `{"metadata":{"annotations":{"example.com/owner":"me"}}}`,
			"may change only the annotations under twill.io/"},
		{"node1's labels", node1, `{"metadata":{"labels":{"node-role.kubernetes.io/control-plane":""}}}`,
			"may not change a Node's labels"},
		{"node1's Ready condition", node1, `{"status":{"conditions":[{"type":"Ready","status":"False","reason":"Evil"}]}}`,
			"may change only the NetworkUnavailable condition"},
	}
	for _, d := range denied {
		err := patch(twill1, d.node, d.body)
		if err == nil || !strings.Contains(err.Error(), d.want) || !strings.Contains(err.Error(), "twill-node-isolation") {
			t.Errorf("node1's twill token patching %s: %v; want it denied by twill-node-isolation with %q", d.what, err, d.want)
		}
	}
	if n := k.node(node2); n.Annotations["twill.io/public-ip"] != k.topo.Nodes[1].Addr.Addr().String() {
		t.Errorf("node2's public-ip annotation is now %q", n.Annotations["twill.io/public-ip"])
	}

	// What twill needs on its own Node still goes through.
	if err := patch(twill1, node1, `{"metadata":{"annotations":{"twill.io/isolation-test":"yes"}}}`); err != nil {
		t.Errorf("node1's twill token patching node1's twill annotations: %v", err)
	}
	cond := `{"status":{"conditions":[{"type":"NetworkUnavailable","status":"False","reason":"TwillIsUp","message":"isolation test"}]}}`
	if err := patch(twill1, node1, cond); err != nil {
		t.Errorf("node1's twill token patching node1's NetworkUnavailable condition: %v", err)
	}
	n := k.node(node1)
	if n.Annotations["twill.io/isolation-test"] != "yes" {
		t.Errorf("node1's annotations after the allowed patch: %v", n.Annotations)
	}
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeNetworkUnavailable && c.Message != "isolation test" {
			t.Errorf("node1's NetworkUnavailable after the allowed patch: %+v", c)
		}
	}

	// Someone else changing what twilld published (here with node1's
	// token, which the policy allows on node1): twilld publishes it
	// again, and counts the conflict.
	if err := patch(twill1, node1, `{"metadata":{"annotations":{"twill.io/public-ip":"10.99.0.250"}}}`); err != nil {
		t.Fatalf("node1's token patching node1's public-ip: %v", err)
	}
	waitFor(t, 15*time.Second, "node1's public-ip published again", func() bool {
		return k.node(node1).Annotations["twill.io/public-ip"] == k.topo.Nodes[0].Addr.Addr().String()
	})
	if got := k.metric(0, "twill_lease_conflicts_total"); got != "1" {
		t.Errorf("node1's twill_lease_conflicts_total = %s, want 1", got)
	}

	// twill's account without a node claim (a token made by hand) can
	// change no Node, not even one.
	unbound := as(k.api.UnboundToken(t, "kube-twill", "twill"))
	if err := patch(unbound, node1, `{"metadata":{"annotations":{"twill.io/isolation-test":"no"}}}`); err == nil || !strings.Contains(err.Error(), "no node-name claim") {
		t.Errorf("an unbound twill token patching node1: %v; want it denied for want of a node claim", err)
	}

	// twill itself works on: a restarted twilld republishes (its patches
	// pass the policy) and the nodes route to each other.
	k.daemons[0].Stop(t)
	k.startKubeDaemon(0)
	k.published(0)
	waitFor(t, 15*time.Second, "node1's route to node2's podCIDR", func() bool {
		return strings.Contains(k.routes(0), podCIDR(1).String()+" via")
	})
}
