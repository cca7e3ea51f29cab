// Package dist_test checks the shipped manifests without a cluster: the
// RBAC grants exactly what twilld needs, and the ConfigMap's files parse
// the way twilld and the CNI runtime will parse them. The e2e suite applies
// the same file to a real apiserver.
package dist_test

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"os"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/containernetworking/cni/libcni"
	admissionv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/util/yaml"

	"github.com/twill-net/twill/subnet"
)

type manifest struct {
	role    rbacv1.ClusterRole
	binding rbacv1.ClusterRoleBinding
	sa      corev1.ServiceAccount
	cm      corev1.ConfigMap
	ds      appsv1.DaemonSet
	policy  admissionv1.ValidatingAdmissionPolicy
	pbind   admissionv1.ValidatingAdmissionPolicyBinding
	kinds   []string
}

func load(t *testing.T) manifest {
	t.Helper()
	data, err := os.ReadFile("kube-twill.yml")
	if err != nil {
		t.Fatal(err)
	}
	var m manifest
	dec := yaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	for {
		doc, err := dec.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if len(bytes.TrimSpace(stripComments(doc))) == 0 {
			continue
		}
		var meta struct{ Kind string }
		if err := yaml.Unmarshal(doc, &meta); err != nil {
			t.Fatal(err)
		}
		m.kinds = append(m.kinds, meta.Kind)
		var dst any
		switch meta.Kind {
		case "ClusterRole":
			dst = &m.role
		case "ClusterRoleBinding":
			dst = &m.binding
		case "ServiceAccount":
			dst = &m.sa
		case "ConfigMap":
			dst = &m.cm
		case "DaemonSet":
			dst = &m.ds
		case "ValidatingAdmissionPolicy":
			dst = &m.policy
		case "ValidatingAdmissionPolicyBinding":
			dst = &m.pbind
		default:
			continue
		}
		if err := yaml.UnmarshalStrict(doc, dst); err != nil {
			t.Fatalf("%s: %v", meta.Kind, err)
		}
	}
	return m
}

func TestManifestKinds(t *testing.T) {
	m := load(t)
	want := []string{"ClusterRole", "ClusterRoleBinding", "ConfigMap", "DaemonSet", "Namespace", "ServiceAccount",
		"ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"}
	got := slices.Clone(m.kinds)
	sort.Strings(got)
	if !slices.Equal(got, want) {
		t.Fatalf("kube-twill.yml kinds %v, want %v", got, want)
	}
}

// TestClusterRoleLeastPrivilege: the role grants nodes get/list/watch,
// nodes/status patch, and (for --network-policy) get/list/watch on pods,
// namespaces, networkpolicies and clusternetworkpolicies, and patch on
// clusternetworkpolicies/status, and nothing more.
func TestClusterRoleLeastPrivilege(t *testing.T) {
	m := load(t)
	allowed := map[string]bool{
		"/nodes/get": true, "/nodes/list": true, "/nodes/watch": true, "/nodes/status/patch": true,
		"/pods/get": true, "/pods/list": true, "/pods/watch": true,
		"/namespaces/get": true, "/namespaces/list": true, "/namespaces/watch": true,
		"networking.k8s.io/networkpolicies/get": true, "networking.k8s.io/networkpolicies/list": true, "networking.k8s.io/networkpolicies/watch": true,
		"policy.networking.k8s.io/clusternetworkpolicies/get": true, "policy.networking.k8s.io/clusternetworkpolicies/list": true,
		"policy.networking.k8s.io/clusternetworkpolicies/watch": true, "policy.networking.k8s.io/clusternetworkpolicies/status/patch": true,
	}
	granted := map[string]bool{}
	for i, r := range m.role.Rules {
		if len(r.NonResourceURLs) > 0 || len(r.ResourceNames) > 0 {
			t.Errorf("rule %d: nonResourceURLs/resourceNames are not expected: %+v", i, r)
		}
		for _, g := range r.APIGroups {
			for _, res := range r.Resources {
				for _, v := range r.Verbs {
					key := g + "/" + res + "/" + v
					if !allowed[key] {
						t.Errorf("ClusterRole %q grants %q (group %q, resource %q, verb %q), which twilld does not need", m.role.Name, key, g, res, v)
					}
					granted[key] = true
				}
			}
		}
	}
	for k := range allowed {
		if !granted[k] {
			t.Errorf("ClusterRole %q lacks %q, which twilld needs", m.role.Name, k)
		}
	}
	if m.role.AggregationRule != nil {
		t.Error("ClusterRole must not aggregate other roles")
	}
	b := m.binding
	if b.RoleRef.Kind != "ClusterRole" || b.RoleRef.Name != m.role.Name || len(b.Subjects) != 1 ||
		b.Subjects[0].Kind != "ServiceAccount" || b.Subjects[0].Name != m.sa.Name || b.Subjects[0].Namespace != m.sa.Namespace {
		t.Errorf("ClusterRoleBinding %+v must bind ClusterRole %q to ServiceAccount %s/%s alone", b, m.role.Name, m.sa.Namespace, m.sa.Name)
	}
}

func TestConfigMapParses(t *testing.T) {
	m := load(t)
	cfg, err := subnet.ParseConfig([]byte(m.cm.Data["net-conf.json"]))
	if err != nil {
		t.Fatalf("net-conf.json: %v", err)
	}
	if cfg.Network.String() != "10.244.0.0/16" {
		t.Errorf("Network %s: want the kube-controller-manager default cluster CIDR 10.244.0.0/16", cfg.Network)
	}
	cl, err := libcni.ConfListFromBytes([]byte(m.cm.Data["cni-conf.json"]))
	if err != nil {
		t.Fatalf("cni-conf.json: %v", err)
	}
	if cl.Plugins[0].Network.Type != "twill" {
		t.Errorf("cni-conf.json: first plugin %q, want twill", cl.Plugins[0].Network.Type)
	}
	dist, err := os.ReadFile("10-twill.conflist")
	if err != nil {
		t.Fatal(err)
	}
	if norm(string(dist)) != norm(m.cm.Data["cni-conf.json"]) {
		t.Error("the ConfigMap's cni-conf.json differs from dist/10-twill.conflist; keep them the same")
	}
}

func TestDaemonSet(t *testing.T) {
	m := load(t)
	spec := m.ds.Spec.Template.Spec
	if !spec.HostNetwork {
		t.Error("DaemonSet: hostNetwork must be true")
	}
	if spec.ServiceAccountName != m.sa.Name {
		t.Errorf("DaemonSet: serviceAccountName %q, want %q", spec.ServiceAccountName, m.sa.Name)
	}
	if len(spec.InitContainers) != 1 {
		t.Errorf("DaemonSet: %d init containers, want 1 (the plugin binary; twilld installs and keeps the conflist)", len(spec.InitContainers))
	}
	c := spec.Containers[0]
	caps := c.SecurityContext.Capabilities.Add
	if !slices.Contains(caps, "NET_ADMIN") || !slices.Contains(caps, "NET_RAW") || len(caps) != 2 {
		t.Errorf("DaemonSet: capabilities %v, want exactly NET_ADMIN and NET_RAW", caps)
	}
	if c.SecurityContext.Privileged != nil && *c.SecurityContext.Privileged {
		t.Error("DaemonSet: the daemon must not be privileged")
	}
	var nodeName bool
	for _, e := range c.Env {
		if e.Name == "NODE_NAME" && e.ValueFrom != nil && e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "spec.nodeName" {
			nodeName = true
		}
	}
	if !nodeName {
		t.Error("DaemonSet: NODE_NAME must come from the downward API (spec.nodeName)")
	}
	if p := c.LivenessProbe; p == nil || p.HTTPGet == nil || p.HTTPGet.Path != "/healthz" {
		t.Error("DaemonSet: liveness probe must GET /healthz")
	}
	if p := c.ReadinessProbe; p == nil || p.HTTPGet == nil || p.HTTPGet.Path != "/readyz" {
		t.Error("DaemonSet: readiness probe must GET /readyz")
	}
	if !slices.ContainsFunc(c.Ports, func(p corev1.ContainerPort) bool {
		return p.HostPort == 10267 && p.ContainerPort == 10267 && (p.Protocol == "" || p.Protocol == corev1.ProtocolTCP)
	}) {
		t.Errorf("DaemonSet: ports %+v lack hostPort 10267 (twilld's: a pod asking for it would be placed on the node)", c.Ports)
	}
	args := strings.Join(c.Args, " ")
	for _, want := range []string{"--kube-subnet-mgr", "--net-config-path=/etc/kube-twill/net-conf.json", "--healthz-port=10267",
		"--cni-conflist=/etc/kube-twill/cni-conf.json", "--cni-conflist-dest=/host/etc/cni/net.d/10-twill.conflist"} {
		if !strings.Contains(args, want) {
			t.Errorf("DaemonSet: args %q lack %q", args, want)
		}
	}
}

func norm(s string) string { return strings.Join(strings.Fields(s), "") }

func stripComments(doc []byte) []byte {
	var out []byte
	for _, line := range bytes.Split(doc, []byte("\n")) {
		if t := bytes.TrimSpace(line); len(t) > 0 && t[0] != '#' {
			out = append(out, line...)
			out = append(out, '\n')
		}
	}
	return out
}

// TestNodeIsolationPolicyWiring: the admission policy applies to twill's
// own ServiceAccount, is bound (denying) without a parameter (a parameter
// kind's watch does not survive a reinstall in kube-apiserver), and the
// prefix it allows is the one twilld is started with.
// What the policy denies is tested against a real apiserver
// (e2e.TestKubeNodeIsolation); a reinstall, by e2e.TestKubeLabHelm.
func TestNodeIsolationPolicyWiring(t *testing.T) {
	m := load(t)
	p, b := m.policy, m.pbind
	user := "system:serviceaccount:" + m.sa.Namespace + ":" + m.sa.Name
	if len(p.Spec.MatchConditions) != 1 || !strings.Contains(p.Spec.MatchConditions[0].Expression, `"`+user+`"`) {
		t.Errorf("policy match conditions %+v: want one, on %s", p.Spec.MatchConditions, user)
	}
	if p.Spec.FailurePolicy == nil || *p.Spec.FailurePolicy != admissionv1.Fail {
		t.Errorf("policy failurePolicy %v, want Fail", p.Spec.FailurePolicy)
	}
	if p.Spec.ParamKind != nil || b.Spec.ParamRef != nil {
		t.Errorf("policy paramKind %+v, binding paramRef %+v: want neither", p.Spec.ParamKind, b.Spec.ParamRef)
	}
	if b.Spec.PolicyName != p.Name || !slices.Equal(b.Spec.ValidationActions, []admissionv1.ValidationAction{admissionv1.Deny}) {
		t.Errorf("binding %+v: want policy %s, Deny", b.Spec, p.Name)
	}
	var prefix string
	for _, v := range p.Spec.Variables {
		if v.Name == "prefix" {
			prefix = v.Expression
		}
	}
	if want := `"` + m.cm.Data["annotation-prefix"] + `/"`; prefix != want {
		t.Errorf("policy's prefix variable %s, want %s (the ConfigMap's annotation-prefix)", prefix, want)
	}
	if m.cm.Data["annotation-prefix"] != "twill.io" {
		t.Errorf("ConfigMap annotation-prefix %q, want twill.io (twilld's default)", m.cm.Data["annotation-prefix"])
	}
	c := m.ds.Spec.Template.Spec.Containers[0]
	if !slices.Contains(c.Args, "--kube-annotation-prefix=$(ANNOTATION_PREFIX)") {
		t.Errorf("twilld args %q do not take the prefix from ANNOTATION_PREFIX", c.Args)
	}
	var fromCM bool
	for _, e := range c.Env {
		if e.Name == "ANNOTATION_PREFIX" && e.ValueFrom != nil && e.ValueFrom.ConfigMapKeyRef != nil &&
			e.ValueFrom.ConfigMapKeyRef.Name == m.cm.Name && e.ValueFrom.ConfigMapKeyRef.Key == "annotation-prefix" {
			fromCM = true
		}
	}
	if !fromCM {
		t.Errorf("ANNOTATION_PREFIX is not the ConfigMap's annotation-prefix: %+v", c.Env)
	}
}

// TestWireGuardKeeper: the keeper's DaemonSet is not rolled by a new
// manifest (OnDelete: twilld's upgrades leave the devices alone), serves
// its socket in the directory twilld keeps its state in (where twilld
// looks for it), and is the only privileged container (a TUN device needs
// it). The keeper in action: e2e.TestKubeLabWireGuard.
func TestWireGuardKeeper(t *testing.T) {
	data, err := os.ReadFile("kube-twill-wireguard.yml")
	if err != nil {
		t.Fatal(err)
	}
	var ds appsv1.DaemonSet
	if err := yaml.UnmarshalStrict(stripComments(data), &ds); err != nil {
		t.Fatal(err)
	}
	if ds.Spec.UpdateStrategy.Type != appsv1.OnDeleteDaemonSetStrategyType {
		t.Errorf("update strategy %q, want OnDelete", ds.Spec.UpdateStrategy.Type)
	}
	spec := ds.Spec.Template.Spec
	c := spec.Containers[0]
	if !spec.HostNetwork || c.SecurityContext == nil || c.SecurityContext.Privileged == nil || !*c.SecurityContext.Privileged {
		t.Error("the keeper needs hostNetwork and a privileged container (/dev/net/tun)")
	}
	if spec.AutomountServiceAccountToken == nil || *spec.AutomountServiceAccountToken {
		t.Error("the keeper needs no API credentials: automountServiceAccountToken must be false")
	}
	if got := strings.Join(c.Command, " "); !strings.Contains(got, "--socket=/var/lib/twill/twill-wg-keeper.sock") {
		t.Errorf("command %q: the socket must be in twilld's state directory, /var/lib/twill", got)
	}
	m := load(t)
	if !strings.Contains(strings.Join(m.ds.Spec.Template.Spec.Containers[0].Args, " "), "--state-dir=/var/lib/twill") {
		t.Error("twilld's state directory is no longer /var/lib/twill: the keeper's socket must follow it")
	}
	if c.Image != m.ds.Spec.Template.Spec.Containers[0].Image {
		t.Errorf("keeper image %q, twilld's %q: one image carries both", c.Image, m.ds.Spec.Template.Spec.Containers[0].Image)
	}
}
