package e2e

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/util/yaml"

	"github.com/twill-net/twill/dist"
	"github.com/twill-net/twill/lab"
	"github.com/twill-net/twill/testsupport/kubetest"
)

// helmChart is dist/chart/twill in the tree, and helm, built from the Go
// module proxy (tools/helm).
type helmChart struct {
	t     *testing.T
	helm  string
	chart string
	home  string
}

func newHelmChart(t *testing.T) *helmChart {
	t.Helper()
	root := kubetest.Root(t)
	return &helmChart{t: t, helm: builtTool(t, "helm", "helm"), chart: filepath.Join(root, "dist", "chart", "twill"), home: t.TempDir()}
}

// run runs helm with its cache, configuration and data in a directory of
// the test's own, and no cluster.
func (h *helmChart) run(args ...string) (string, error) {
	cmd := exec.Command(h.helm, args...)
	cmd.Env = append(os.Environ(), "HELM_CACHE_HOME="+h.home+"/cache", "HELM_CONFIG_HOME="+h.home+"/config",
		"HELM_DATA_HOME="+h.home+"/data", "KUBECONFIG="+h.home+"/no-kubeconfig")
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// template renders the chart with these helm flags, and fails the test if
// helm refuses.
func (h *helmChart) template(args ...string) map[string]any {
	h.t.Helper()
	out, err := h.run(append([]string{"template", "twill", h.chart}, args...)...)
	if err != nil {
		h.t.Fatalf("helm template %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return objects(h.t, []byte(out))
}

// configChecksum is the one thing the chart renders that the manifest
// cannot: a checksum of the ConfigMap on twilld's pod template.
const configChecksum = "twill.io/config-checksum"

// withoutChecksum drops configChecksum from twilld's pod template, and its
// annotations if it was the only one: what is left is the manifest's.
func withoutChecksum(objs map[string]any) map[string]any {
	if m, ok := dig(objs[twillDS], "spec", "template", "metadata").(map[string]any); ok {
		if ann, ok := m["annotations"].(map[string]any); ok {
			delete(ann, configChecksum)
			if len(ann) == 0 {
				delete(m, "annotations")
			}
		}
	}
	return objs
}

// objects parses a stream of YAML documents into its objects, keyed by
// kind, namespace and name. A ConfigMap's *.json values are parsed too:
// two JSON files that say the same thing are the same file to twilld and
// to the CNI runtime, whatever their layout.
func objects(t *testing.T, stream []byte) map[string]any {
	t.Helper()
	objs := map[string]any{}
	r := yaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(stream)))
	for {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			return objs
		}
		if err != nil {
			t.Fatal(err)
		}
		var o map[string]any
		if err := yaml.Unmarshal(doc, &o); err != nil {
			t.Fatalf("%v in\n%s", err, doc)
		}
		if o == nil {
			continue
		}
		meta, _ := o["metadata"].(map[string]any)
		key := fmt.Sprintf("%v %v/%v", o["kind"], meta["namespace"], meta["name"])
		if _, dup := objs[key]; dup {
			t.Fatalf("%s twice", key)
		}
		if data, ok := o["data"].(map[string]any); ok && o["kind"] == "ConfigMap" {
			for k, v := range data {
				if s, ok := v.(string); ok && strings.HasSuffix(k, ".json") {
					var parsed any
					if err := json.Unmarshal([]byte(s), &parsed); err != nil {
						t.Fatalf("%s: %s: %v\n%s", key, k, err, s)
					}
					data[k] = parsed
				}
			}
		}
		objs[key] = unordered(o).(map[string]any)
	}
}

// unordered sorts the lists whose order means nothing to Kubernetes (a
// pod's volumes and a container's volume mounts) by name: kustomize's
// patches add theirs first.
func unordered(v any) any {
	m, ok := v.(map[string]any)
	if !ok {
		if l, ok := v.([]any); ok {
			for i := range l {
				l[i] = unordered(l[i])
			}
		}
		return v
	}
	for k, e := range m {
		m[k] = unordered(e)
		if l, ok := e.([]any); ok && (k == "volumes" || k == "volumeMounts") {
			slices.SortFunc(l, func(a, b any) int { return strings.Compare(fmt.Sprint(dig(a, "name")), fmt.Sprint(dig(b, "name"))) })
		}
	}
	return m
}

// sameObjects fails the test with the first difference between got (the
// chart's, its config checksum aside) and want.
func sameObjects(t *testing.T, what string, got, want map[string]any) {
	t.Helper()
	got = withoutChecksum(got)
	var keys []string
	for k := range want {
		keys = append(keys, k)
	}
	for k := range got {
		if _, ok := want[k]; !ok {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	for _, k := range slices.Compact(keys) {
		g, w := got[k], want[k]
		switch {
		case g == nil:
			t.Errorf("%s: the chart does not render %s", what, k)
		case w == nil:
			t.Errorf("%s: the chart renders %s, which is not in the manifest", what, k)
		case !reflect.DeepEqual(g, w):
			gj, _ := json.MarshalIndent(g, "", "  ")
			wj, _ := json.MarshalIndent(w, "", "  ")
			t.Errorf("%s: %s differs:\nchart:\n%s\nmanifest:\n%s", what, k, gj, wj)
		}
	}
}

// TestHelmChart checks dist/chart/twill without a cluster: helm lint is
// clean; its defaults render the objects of dist/kube-twill.yml, its
// backend and IP-family values the manifests the lab applies (the edits
// Documentation/kubernetes.md gives), its flannelMigration value the
// objects of dist/flannel-migration; each value family lands where it
// should; and the schema refuses wrong types and unknown keys, naming
// them. TestKubeLabHelm installs it.
func TestHelmChart(t *testing.T) {
	beside(t)
	h := newHelmChart(t)

	t.Run("helm lint is clean", func(t *testing.T) {
		out, err := h.run("lint", "--strict", h.chart)
		if err != nil || !strings.Contains(out, "0 chart(s) failed") || strings.Contains(out, "[WARNING]") || strings.Contains(out, "[ERROR]") {
			t.Fatalf("helm lint --strict: %v\n%s", err, out)
		}
	})

	t.Run("the defaults are dist/kube-twill.yml", func(t *testing.T) {
		sameObjects(t, "defaults", h.template(), objects(t, dist.KubeManifest))
	})

	t.Run("a ConfigMap change rolls twilld's pods", func(t *testing.T) {
		sum := func(args ...string) any {
			return dig(h.template(args...)[twillDS], "spec", "template", "metadata", "annotations", configChecksum)
		}
		a, b := sum(), sum("--set-json", `netConf={"PublicIPRanges":["192.168.0.0/16"]}`)
		if a == nil || a == b || sum() != a {
			t.Errorf("%s: %v by default (twice: %v), %v with another netConf; want a stable checksum that changes with the ConfigMap", configChecksum, a, sum(), b)
		}
	})

	t.Run("backend and IP family are the lab's manifest", func(t *testing.T) {
		for _, c := range []struct{ backend, family string }{
			{"vxlan", "ipv4"}, {"host-gw", "ipv4"}, {"wireguard", "ipv4"}, {"vxlan", "dual"}, {"host-gw", "ipv6"},
		} {
			m, err := lab.InstallManifest(dist.ShippedImage, c.backend, c.family)
			if err != nil {
				t.Fatal(err)
			}
			got := h.template(lab.HelmValues(dist.ShippedImage, c.backend, c.family, nil)...)
			sameObjects(t, c.backend+"/"+c.family, got, objects(t, m))
		}
	})

	t.Run("flannelMigration is dist/flannel-migration", func(t *testing.T) {
		_, kubectl := kubetest.Binaries(t)
		out, err := exec.Command(kubectl, "kustomize", "--load-restrictor", "LoadRestrictionsNone",
			filepath.Join(kubetest.Root(t), "dist", "flannel-migration")).CombinedOutput()
		if err != nil {
			t.Fatalf("kubectl kustomize dist/flannel-migration: %v\n%s", err, out)
		}
		sameObjects(t, "flannelMigration", h.template("--set", "flannelMigration.enabled=true", "--set", "networkPolicy=false"), objects(t, out))
	})

	t.Run("values", func(t *testing.T) { testHelmValues(t, h) })
	t.Run("the schema refuses bad values, naming them", func(t *testing.T) { testHelmRefusals(t, h) })
}

// dig is the value at path in a rendered object (map keys, or a list's
// element whose "name" is the key).
func dig(v any, path ...string) any {
	for _, p := range path {
		switch x := v.(type) {
		case map[string]any:
			v = x[p]
		case []any:
			v = nil
			for _, e := range x {
				if m, ok := e.(map[string]any); ok && m["name"] == p {
					v = m
				}
			}
		default:
			return nil
		}
	}
	return v
}

const (
	twillDS   = "DaemonSet kube-twill/kube-twill-ds"
	keeperDS  = "DaemonSet kube-twill/kube-twill-wireguard"
	twillCfg  = "ConfigMap kube-twill/kube-twill-cfg"
	nodeIsoVP = "ValidatingAdmissionPolicy <nil>/twill-node-isolation"
)

func twilldArgs(objs map[string]any, ds string) []string {
	var args []string
	for _, a := range dig(objs[ds], "spec", "template", "spec", "containers", "kube-twill", "args").([]any) {
		args = append(args, a.(string))
	}
	return args
}

// testHelmValues renders each value family and checks that it lands where
// an operator would look for it.
func testHelmValues(t *testing.T, h *helmChart) {
	const digest = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	podSpec := func(objs map[string]any, ds string) any { return dig(objs[ds], "spec", "template", "spec") }
	netConf := func(objs map[string]any) any { return dig(objs[twillCfg], "data", "net-conf.json") }

	objs := h.template("--set", "image.repository=registry.example.com/net/twill", "--set", "image.tag=v9",
		"--set", "image.digest="+digest, "--set", "image.pullPolicy=Always", "--set", "backend.type=wireguard")
	for _, c := range []struct{ ds, container string }{{twillDS, "install-cni-plugin"}, {twillDS, "kube-twill"}, {keeperDS, "keeper"}} {
		ctr := dig(podSpec(objs, c.ds), "containers", c.container)
		if ctr == nil {
			ctr = dig(podSpec(objs, c.ds), "initContainers", c.container)
		}
		if img, pp := dig(ctr, "image"), dig(ctr, "imagePullPolicy"); img != "registry.example.com/net/twill:v9@"+digest || pp != "Always" {
			t.Errorf("image values: %s's %s runs %v (pull policy %v)", c.ds, c.container, img, pp)
		}
	}

	objs = h.template("--set", "networkPolicy=false", "--set", "netfilter=nftables", "--set", "ipMasq=false")
	if args := twilldArgs(objs, twillDS); slices.Contains(args, "--network-policy") || slices.Contains(args, "--ip-masq") || !slices.Contains(args, "--netfilter=nftables") {
		t.Errorf("networkPolicy=false netfilter=nftables ipMasq=false: twilld %v", args)
	}
	if args := twilldArgs(h.template(), twillDS); !slices.Contains(args, "--network-policy") || slices.ContainsFunc(args, func(a string) bool {
		return strings.HasPrefix(a, "--netfilter") || strings.HasPrefix(a, "--network-policy-log")
	}) {
		t.Errorf("defaults: twilld %v, want --network-policy and no --netfilter (auto), nor any --network-policy-log flag (the defaults)", args)
	}
	// A release made by a chart without verdictLog, upgraded with
	// --reuse-values, has no verdictLog: it renders as the defaults.
	if args, def := twilldArgs(h.template("--set", "verdictLog=null"), twillDS), twilldArgs(h.template(), twillDS); !slices.Equal(args, def) {
		t.Errorf("verdictLog absent: twilld %v, want the defaults' %v", args, def)
	}
	objs = h.template("--set", "verdictLog.denied=false", "--set", "verdictLog.allowed=true", "--set", "verdictLog.sample=10")
	if args := twilldArgs(objs, twillDS); !slices.Contains(args, "--network-policy-log-denied=false") || !slices.Contains(args, "--network-policy-log-allowed") ||
		!slices.Contains(args, "--network-policy-log-sample=10") {
		t.Errorf("verdictLog.denied=false allowed=true sample=10: twilld %v", args)
	}

	objs = h.template("--set", "backend.type=wireguard", "--set-json", `tolerations=[{"key":"net","operator":"Exists"}]`,
		"--set-json", `nodeSelector={"pool":"net"}`, "--set", "priorityClassName=net-critical",
		"--set-json", `resources={"requests":{"cpu":"1"}}`)
	for _, ds := range []string{twillDS, keeperDS} {
		spec := podSpec(objs, ds)
		want := map[string]any{"tolerations": []any{map[string]any{"key": "net", "operator": "Exists"}},
			"nodeSelector": map[string]any{"pool": "net"}, "priorityClassName": "net-critical"}
		for k, v := range want {
			if !reflect.DeepEqual(dig(spec, k), v) {
				t.Errorf("scheduling values: %s's %s is %v, want %v", ds, k, dig(spec, k), v)
			}
		}
	}
	// Helm merges a map value with the default's.
	if r := dig(podSpec(objs, twillDS), "containers", "kube-twill", "resources"); !reflect.DeepEqual(r,
		map[string]any{"requests": map[string]any{"cpu": "1", "memory": "50Mi"}, "limits": map[string]any{"memory": "200Mi"}}) {
		t.Errorf("resources: twilld's are %v", r)
	}

	objs = h.template("--set", "nodeIsolation=false", "--set", "wireguardKeeper.enabled=false", "--set", "backend.type=wireguard")
	for _, k := range []string{nodeIsoVP, "ValidatingAdmissionPolicyBinding <nil>/twill-node-isolation", keeperDS} {
		if objs[k] != nil {
			t.Errorf("nodeIsolation=false wireguardKeeper.enabled=false: %s still rendered", k)
		}
	}

	objs = h.template("--set", "namespace.name=net", "--set", "namespace.create=false")
	for k := range objs {
		if strings.HasPrefix(k, "Namespace ") || strings.Contains(k, " kube-twill/") {
			t.Errorf("namespace.name=net namespace.create=false: %s rendered", k)
		}
	}
	vap, _ := json.Marshal(objs[nodeIsoVP])
	if !strings.Contains(string(vap), "system:serviceaccount:net:twill") || dig(objs["ClusterRoleBinding <nil>/twill"], "subjects", "twill", "namespace") != "net" {
		t.Errorf("namespace.name=net: the node-isolation policy or the ClusterRoleBinding still name kube-twill")
	}

	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--set-json", `backend.vxlan={"VNI":4,"Port":4789,"DirectRouting":true}`},
			`{"Backend":{"DirectRouting":true,"Port":4789,"Type":"vxlan","VNI":4},"Network":"10.244.0.0/16"}`},
		{[]string{"--set", "backend.type=wireguard", "--set-json", `backend.wireguard={"Mode":"auto","PersistentKeepaliveInterval":25}`},
			`{"Backend":{"Mode":"auto","PersistentKeepaliveInterval":25,"Type":"wireguard"},"Network":"10.244.0.0/16"}`},
		{[]string{"--set", "backend.type=eni", "--set-json", `backend.eni={"Interface":"eth1","Mode":"secondary-ip"}`},
			`{"Backend":{"Interface":"eth1","Mode":"secondary-ip","Type":"eni"},"Network":"10.244.0.0/16"}`},
		{[]string{"--set", "network=10.42.0.0/16", "--set-json", `netConf={"SubnetLen":26,"PublicIPRanges":["192.168.0.0/16"],"EnableNFTables":true}`},
			`{"Backend":{"Type":"vxlan"},"EnableNFTables":true,"Network":"10.42.0.0/16","PublicIPRanges":["192.168.0.0/16"],"SubnetLen":26}`},
	} {
		got, _ := json.Marshal(netConf(h.template(c.args...)))
		if string(got) != c.want {
			t.Errorf("%v: net-conf.json %s, want %s", c.args, got, c.want)
		}
	}

	objs = h.template("--set", "annotationPrefix=net.example.com", "--set", "cniNetwork=podnet")
	if p, n := dig(objs[twillCfg], "data", "annotation-prefix"), dig(objs[twillCfg], "data", "cni-conf.json", "name"); p != "net.example.com" || n != "podnet" {
		t.Errorf("annotationPrefix, cniNetwork: the ConfigMap has %v and %v", p, n)
	}
	if v := dig(objs[nodeIsoVP], "spec", "variables", "prefix", "expression"); v != `"net.example.com/"` {
		t.Errorf("annotationPrefix: the node-isolation policy's prefix is %v", v)
	}
}

// testHelmRefusals gives the chart bad values: helm refuses each before
// rendering anything, naming the value.
func testHelmRefusals(t *testing.T, h *helmChart) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--set", "network=5"}, "at '/network': got number, want string"},
		{[]string{"--set", "networkPolicy=yes"}, "at '/networkPolicy': got string, want boolean"},
		{[]string{"--set", "verdictLog.sample=0"}, "at '/verdictLog/sample': minimum: got 0, want 1"},
		{[]string{"--set", "netwrok=10.0.0.0/8"}, "additional properties 'netwrok' not allowed"},
		{[]string{"--set", "backend.type=ipip"}, "at '/backend/type': value must be one of 'vxlan', 'host-gw', 'wireguard', 'eni'"},
		{[]string{"--set-json", `backend.vxlan={"VNI":"x"}`}, "at '/backend/vxlan/VNI': got string, want integer"},
		{[]string{"--set-json", `backend.vxlan={"Vni":1}`}, "at '/backend/vxlan': additional properties 'Vni' not allowed"},
		{[]string{"--set-json", `netConf={"Network":"10.0.0.0/8"}`}, "at '/netConf': additional properties 'Network' not allowed"},
		{[]string{"--set", "netfilter=ebtables"}, "at '/netfilter': value must be one of 'auto', 'iptables', 'nftables'"},
		{[]string{"--set", "image.digest=latest"}, "at '/image/digest': 'latest' does not match pattern"},
		{[]string{"--set", "backend.type=host-gw", "--set-json", `backend.vxlan={"VNI":2}`}, `backend.vxlan is set, but backend.type is "host-gw"`},
		{[]string{"--set-json", `network=""`}, "network: empty, and so is ipv6Network"},
	} {
		out, err := h.run(append([]string{"template", "twill", h.chart}, c.args...)...)
		if err == nil || !strings.Contains(out, c.want) || strings.Contains(out, "kind: DaemonSet") {
			t.Errorf("helm template %s: %v, want a refusal saying %q:\n%s", strings.Join(c.args, " "), err, c.want, out)
		}
	}
}
