package policy

import (
	"context"
	"io"
	"log/slog"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/twill-net/twill/policy/cnpapi"
)

// TestClusterStatusOneWriter: of three Ready nodes, exactly one writes a
// policy's condition; it says Enforced, or names the field twill does
// not enforce; a condition already held is not written again.
func TestClusterStatusOneWriter(t *testing.T) {
	var nodes []*corev1.Node
	for _, n := range []string{"n1", "n2", "n3"} {
		nodes = append(nodes, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n},
			Status: corev1.NodeStatus{Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}}}})
	}
	s := snapshot()
	s.Nodes = nodes
	s.ClusterPolicies = []*cnpapi.ClusterNetworkPolicy{
		testCNP("fine", cnpapi.Admin, 1, func(sp *cnpapi.Spec) { sp.Ingress = []cnpapi.IngressRule{fromNS("y", cnpapi.Deny)} }),
		testCNP("fqdn", cnpapi.Admin, 2, func(sp *cnpapi.Spec) {
			sp.Egress = []cnpapi.EgressRule{{Action: cnpapi.Accept, To: []cnpapi.EgressPeer{{DomainNames: []string{"example.com"}}}}}
		}),
	}
	writes := map[string][]string{} // policy -> writer nodes
	conds := map[string]metav1.Condition{}
	for _, n := range nodes {
		w := &ClusterStatus{Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Node: n.Name,
			Apply: func(_ context.Context, name string, c metav1.Condition) error {
				writes[name] = append(writes[name], n.Name)
				conds[name] = c
				return nil
			}}
		w.Update(s, Compile(s))
		w.writeAll(context.Background())
	}
	for _, name := range []string{"fine", "fqdn"} {
		if len(writes[name]) != 1 {
			t.Errorf("%s written by %v, want one node", name, writes[name])
		}
	}
	if c := conds["fine"]; c.Status != metav1.ConditionTrue || c.Reason != ReasonEnforced || c.LastTransitionTime.IsZero() {
		t.Errorf("fine: %+v", c)
	}
	if c := conds["fqdn"]; c.Status != metav1.ConditionFalse || !strings.Contains(c.Message, "spec.egress[0].to[0].domainNames") {
		t.Errorf("fqdn: %+v", c)
	}
	// Once the object holds it, the writer writes nothing more.
	s.ClusterPolicies[0].Status.Conditions = []metav1.Condition{conds["fine"]}
	s.ClusterPolicies[1].Status.Conditions = []metav1.Condition{conds["fqdn"]}
	again := 0
	w := &ClusterStatus{Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Node: writes["fine"][0],
		Apply: func(context.Context, string, metav1.Condition) error { again++; return nil }}
	w.Update(s, Compile(s))
	w.writeAll(context.Background())
	if again != 0 {
		t.Errorf("%d writes of conditions the objects hold", again)
	}
}
