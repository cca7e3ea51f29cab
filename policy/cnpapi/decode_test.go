package cnpapi

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"
)

const example = `{
  "apiVersion": "policy.networking.k8s.io/v1beta1", "kind": "ClusterNetworkPolicy",
  "metadata": {"name": "deny-db", "resourceVersion": "7", "managedFields": [{"manager": "kubectl"}]},
  "spec": {"tier": "Admin", "priority": 10,
    "subject": {"pods": {"namespaceSelector": {"matchLabels": {"team": "a"}}, "podSelector": {}}},
    "ingress": [{"name": "no-db", "action": "Deny", "from": [{"namespaces": {"matchExpressions": [{"key": "team", "operator": "In", "values": ["b"]}]}}],
      "protocols": [{"tcp": {"destinationPort": {"number": 5432}}}, {"udp": {"destinationPort": {"range": {"start": 1, "end": 9}}}}]}],
    "egress": [{"action": "Accept", "to": [{"networks": ["10.0.0.0/8"]}, {"nodes": {}}, {"domainNames": ["example.com"]}],
      "protocols": [{"destinationNamedPort": "http"}]}]},
  "status": {"conditions": [{"type": "Accepted", "status": "True", "reason": "x", "message": "", "lastTransitionTime": "2026-11-27T00:00:00Z"}]}
}`

func decode(t *testing.T, s string) *ClusterNetworkPolicy {
	t.Helper()
	var obj map[string]any
	if err := json.Unmarshal([]byte(s), &obj); err != nil {
		t.Fatal(err)
	}
	p, err := Decode(obj)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func TestDecodeKnowsTheWholeAPI(t *testing.T) {
	p := decode(t, example)
	if len(p.Unknown) > 0 {
		t.Errorf("unknown fields in the API's own example: %v", p.Unknown)
	}
	if p.Spec.Tier != Admin || p.Spec.Priority != 10 || p.Spec.Ingress[0].Protocols[1].UDP.DestinationPort.Range.End != 9 ||
		p.Spec.Egress[0].To[2].DomainNames[0] != "example.com" || p.Spec.Egress[0].Protocols[0].DestinationNamedPort != "http" {
		t.Errorf("decoded %+v", p.Spec)
	}
}

func TestDecodeNamesUnknownFields(t *testing.T) {
	s := strings.Replace(example, `{"networks": ["10.0.0.0/8"]}`, `{"services": ["x"]}`, 1)
	s = strings.Replace(s, `"priority": 10,`, `"priority": 10, "mode": "strict",`, 1)
	p := decode(t, s)
	want := []string{"spec.egress[0].to[0].services", "spec.mode"}
	if !slices.Equal(p.Unknown, want) {
		t.Errorf("unknown %v, want %v", p.Unknown, want)
	}
}

func TestDecodeTypeErrorNamesTheField(t *testing.T) {
	var obj map[string]any
	_ = json.Unmarshal([]byte(strings.Replace(example, `"priority": 10`, `"priority": "high"`, 1)), &obj)
	_, err := Decode(obj)
	if err == nil || !strings.Contains(err.Error(), "spec.priority") || !strings.Contains(err.Error(), "string") {
		t.Errorf("err %v, want one naming spec.priority", err)
	}
}

func FuzzDecode(f *testing.F) {
	f.Add([]byte(example))
	f.Add([]byte(`{"spec": {"ingress": [{"from": [{}]}]}}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		var obj map[string]any
		if json.Unmarshal(data, &obj) != nil {
			return
		}
		_, _ = Decode(obj) // must not panic
	})
}
