package e2e

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/twill-net/twill/lab"
	"github.com/twill-net/twill/testsupport/kubetest"
)

// TestKubeLabHelm installs twill with helm install (dist/chart/twill, as
// Documentation/kubernetes.md#helm says), not kubectl apply, under real
// kubelets and containerds, and checks every pod pair after each step:
//   - wireguard: installed, with the keeper, pods talk;
//   - vxlan, installed with networkPolicy=false: helm upgrade turns policy
//     on (a deny-all policy then denies, and its removal allows again);
//     helm upgrade to host-gw is refused, naming backend.type, and nothing
//     changes; helm uninstall leaves the data plane (pods keep talking), the
//     cleanup DaemonSet removes it; helm install with host-gw, the
//     documented way to change the backend, brings the pods back.
func TestKubeLabHelm(t *testing.T) {
	t.Parallel()
	for _, backend := range []string{"vxlan", "wireguard"} {
		t.Run(backend, func(t *testing.T) {
			kubeLab(t)
			testKubeLabHelm(t, backend)
		})
	}
	t.Run("adopt", func(t *testing.T) {
		kubeLab(t)
		testKubeLabHelmAdopt(t)
	})
}

// testKubeLabHelmAdopt moves twill installed with kubectl apply (the lab's
// default) to a Helm release, as Documentation/kubernetes.md#helm says:
// label and annotate its objects, helm install with the cluster's values.
// twilld's pods roll once (the chart's config checksum is new to them), and
// pods keep talking.
func testKubeLabHelmAdopt(t *testing.T) {
	l := newLabCtl(t)
	name := labName("ha")
	s := l.upKube(name, 2, 1, "host-gw", "--helm-bin", builtTool(t, "helm", "helm"))
	ctx := context.Background()
	kubectl := labKubectl(t, s)
	podUIDs := func() string {
		return kubectl("-n", lab.TwillNamespace, "get", "pods", "-l", "app.kubernetes.io/name=twill", "-o", "jsonpath={.items[*].metadata.uid}")
	}
	before := podUIDs()
	if out, err := s.Helm(ctx, append([]string{"install", lab.HelmRelease, filepath.Join(kubetest.Root(t), "dist", "chart", "twill")},
		lab.HelmValues(s.TwillImage, "host-gw", s.IPFamily, nil)...)...); err == nil || !strings.Contains(out, "invalid ownership metadata") {
		t.Fatalf("helm install over twill installed by kubectl, before adopting: %v, want it refused for ownership:\n%s", err, out)
	}
	for _, o := range [][]string{{"namespace/kube-twill"}, {"clusterrole/twill"}, {"clusterrolebinding/twill"},
		{"validatingadmissionpolicy/twill-node-isolation"}, {"validatingadmissionpolicybinding/twill-node-isolation"},
		{"-n", "kube-twill", "serviceaccount/twill"}, {"-n", "kube-twill", "configmap/kube-twill-cfg"}, {"-n", "kube-twill", "daemonset/kube-twill-ds"}} {
		kubectl(append(append([]string{"label", "--overwrite"}, o...), "app.kubernetes.io/managed-by=Helm")...)
		kubectl(append(append([]string{"annotate", "--overwrite"}, o...), "meta.helm.sh/release-name=twill", "meta.helm.sh/release-namespace=default")...)
	}
	if out, err := s.Helm(ctx, append([]string{"install", lab.HelmRelease, filepath.Join(kubetest.Root(t), "dist", "chart", "twill")},
		lab.HelmValues(s.TwillImage, "host-gw", s.IPFamily, nil)...)...); err != nil {
		t.Fatalf("helm install after adopting: %v\n%s", err, out)
	}
	waitTwillRolled(t, s)
	if after := podUIDs(); after == before || len(strings.Fields(after)) != 2 {
		t.Errorf("twill's pods after the adoption: %q, before %q; want two new ones (rolled for the config checksum)", after, before)
	}
	if out := helm(t, s, "status", lab.HelmRelease); !strings.Contains(out, "STATUS: deployed") {
		t.Errorf("helm status after the adoption:\n%s", out)
	}
	l.checkAll(name)
}

// helm runs helm in lab s and fails the test when it fails.
func helm(t *testing.T, s *lab.State, args ...string) string {
	t.Helper()
	out, err := s.Helm(context.Background(), args...)
	if err != nil {
		t.Fatalf("helm %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return out
}

func testKubeLabHelm(t *testing.T, backend string) {
	l := newLabCtl(t)
	name := labName("h" + backend[:1])
	up := []string{"--helm", "--helm-bin", builtTool(t, "helm", "helm")}
	if backend == "vxlan" {
		up = append(up, "--helm-set", "networkPolicy=false")
	}
	s := l.upKube(name, 2, 1, backend, up...)
	ctx := context.Background()
	kubectl := labKubectl(t, s)
	helm := func(args ...string) string {
		t.Helper()
		out, err := s.Helm(ctx, args...)
		if err != nil {
			t.Fatalf("helm %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return out
	}
	if out := helm("status", lab.HelmRelease); !strings.Contains(out, "STATUS: deployed") {
		t.Fatalf("helm status after lab up --helm:\n%s", out)
	}
	l.checkAll(name)
	if backend == "wireguard" {
		if out := kubectl("-n", lab.TwillNamespace, "get", "ds", "kube-twill-wireguard", "-o", "jsonpath={.status.numberReady}"); out != "2" {
			t.Errorf("the keeper's DaemonSet: %q pods ready, want 2", out)
		}
		return
	}
	chart := filepath.Join(s.Dir, "chart", "twill")

	// Policy on: twilld restarts with --network-policy and enforces.
	helm("upgrade", lab.HelmRelease, chart, "--reuse-values", "--set", "networkPolicy=true")
	waitTwillRolled(t, s)
	for _, n := range s.Nodes {
		waitFor(t, 60*time.Second, n.Name+"'s table inet twill-policy", func() bool {
			out, err := s.NodeExec(ctx, n.Name, nil, "nft", "list", "tables")
			return err == nil && strings.Contains(out, "inet twill-policy")
		})
	}
	l.checkAll(name)
	denyAll := "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: deny-all, namespace: " + labWorkloadNS + "}\nspec: {podSelector: {}, policyTypes: [Ingress]}\n"
	if out, err := s.Kubectl(ctx, strings.NewReader(denyAll), "apply", "-f", "-"); err != nil {
		t.Fatalf("kubectl apply deny-all: %v\n%s", err, out)
	}
	waitFor(t, 60*time.Second, "the deny-all policy to deny pod to pod", func() bool {
		out, err := l.run("check", "--name", name)
		return err != nil && strings.Contains(out, "pod pairs cannot connect")
	})
	kubectl("-n", labWorkloadNS, "delete", "networkpolicy", "deny-all")
	waitFor(t, 60*time.Second, "every pair to connect once the policy is gone", func() bool {
		_, err := l.run("check", "--name", name)
		return err == nil
	})

	// The backend does not change in place: refused, and nothing changed.
	out, err := s.Helm(ctx, "upgrade", lab.HelmRelease, chart, "--reuse-values", "--set", "backend.type=host-gw")
	if err == nil || !strings.Contains(out, `backend.type: the cluster runs "vxlan", this release asks for "host-gw"`) {
		t.Fatalf("helm upgrade --set backend.type=host-gw: %v, want it refused naming backend.type:\n%s", err, out)
	}
	if cm := kubectl("-n", lab.TwillNamespace, "get", "cm", "kube-twill-cfg", "-o", "jsonpath={.data.net-conf\\.json}"); !strings.Contains(cm, `"vxlan"`) {
		t.Fatalf("net-conf.json after the refused upgrade:\n%s", cm)
	}
	if out := helm("history", lab.HelmRelease, "--max", "1"); !strings.Contains(out, "deployed") || !strings.HasPrefix(strings.Fields(strings.Split(out, "\n")[1])[0], "2") {
		t.Errorf("helm history after the refused upgrade (want revision 2 deployed):\n%s", out)
	}
	l.checkAll(name)

	testKubeLabHelmUninstall(t, l, s, name)

	// The documented way to another backend: install it afresh.
	helm(append([]string{"install", lab.HelmRelease, chart}, lab.HelmValues(s.TwillImage, "host-gw", s.IPFamily, nil)...)...)
	waitTwillRolled(t, s)
	l.checkAll(name)
}

// testKubeLabHelmUninstall runs helm uninstall, checks that pods keep
// talking, then runs the cleanup DaemonSet of dist/kube-twill-cleanup.yml
// and checks that twill is gone from every node.
func testKubeLabHelmUninstall(t *testing.T, l *labCtl, s *lab.State, name string) {
	ctx := context.Background()
	kubectl := labKubectl(t, s)
	if out, err := s.Helm(ctx, "uninstall", lab.HelmRelease, "--wait", "--timeout", "2m"); err != nil {
		t.Fatalf("helm uninstall: %v\n%s", err, out)
	}
	waitFor(t, 2*time.Minute, "namespace kube-twill to go", func() bool {
		out, err := s.Kubectl(ctx, nil, "get", "ns", lab.TwillNamespace)
		return err != nil && strings.Contains(out, "NotFound")
	})
	l.checkAll(name) // the data plane stays until the cleanup

	cleanup, err := os.ReadFile(filepath.Join(kubetest.Root(t), "dist", "kube-twill-cleanup.yml"))
	if err != nil {
		t.Fatal(err)
	}
	if out, err := s.Kubectl(ctx, strings.NewReader(string(cleanup)), "apply", "-f", "-"); err != nil {
		t.Fatalf("kubectl apply -f kube-twill-cleanup.yml: %v\n%s", err, out)
	}
	kubectl("-n", "kube-system", "rollout", "status", "ds/twill-cleanup", "--timeout", "3m")
	for _, n := range s.Nodes {
		for what, cmd := range map[string]string{
			"twill's devices":      "ip -o link show | grep -c ' twill\\.' || true",
			"twill's routes":       "ip route show proto 167 | wc -l",
			"the conflist":         "ls /etc/cni/net.d/ | grep -c twill || true",
			"the plugin":           "ls /opt/cni/bin/ | grep -cx twill || true",
			"the nftables table":   "nft list tables | grep -c 'inet twill$' || true",
			"the policy nft table": "nft list tables | grep -c 'inet twill-policy' || true",
			"subnet.env":           "ls /run/twill/ 2>/dev/null | grep -c subnet.env || true",
		} {
			out, err := s.NodeExec(ctx, n.Name, nil, "sh", "-c", cmd)
			if err != nil || strings.TrimSpace(out) != "0" {
				t.Errorf("%s: %s after the cleanup: %q (%v) from %s", n.Name, what, strings.TrimSpace(out), err, cmd)
			}
		}
	}
	if out, err := s.Kubectl(ctx, strings.NewReader(string(cleanup)), "delete", "-f", "-"); err != nil {
		t.Fatalf("kubectl delete -f kube-twill-cleanup.yml: %v\n%s", err, out)
	}
}

// waitTwillRolled waits for twill's DaemonSet to have rolled out on every
// node and every Node to be ready.
func waitTwillRolled(t *testing.T, s *lab.State) {
	t.Helper()
	ctx := context.Background()
	deadline := time.Now().Add(3 * time.Minute * waitScale())
	for {
		why, err := s.TwillReady(ctx)
		if err == nil && why == "" {
			return
		}
		if time.Now().After(deadline) {
			pods, _ := s.Kubectl(ctx, nil, "-n", lab.TwillNamespace, "get", "pods", "-o", "wide")
			logs, _ := s.Kubectl(ctx, nil, "-n", lab.TwillNamespace, "logs", "ds/kube-twill-ds", "--all-containers", "--tail", "30")
			t.Fatalf("twill's DaemonSet did not roll out: %s %v\n%s\n%s", why, err, pods, logs)
		}
		time.Sleep(time.Second)
	}
}

// labWorkloadNS is the namespace of the lab's echo pods.
const labWorkloadNS = "lab"
