package e2e

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/twill-net/twill/dist"
	"github.com/twill-net/twill/lab"
)

// twillBuild is a build of twill as a cluster installs it: its image and
// its manifests (kube-twill.yml, kube-twill-wireguard.yml).
type twillBuild struct {
	name         string
	image        string
	kube, keeper []byte
}

// earlierBuild is the build the version-skew rollouts start from: the
// previous round's last commit, built by tools/skew/build.sh (cached by
// commit), its image imported into every node's containerd.
func earlierBuild(t *testing.T, s *lab.State) twillBuild {
	t.Helper()
	tar := builtTool(t, "skew", "twill.tar")
	dir := filepath.Dir(tar)
	b := twillBuild{name: "the previous round's build (" + filepath.Base(dir)[:7] + ")", image: "twill.local/twill:skew-" + filepath.Base(dir)[:7]}
	var err error
	if b.kube, err = os.ReadFile(filepath.Join(dir, "kube-twill.yml")); err != nil {
		t.Fatal(err)
	}
	if b.keeper, err = os.ReadFile(filepath.Join(dir, "kube-twill-wireguard.yml")); err != nil {
		t.Fatal(err)
	}
	for _, n := range s.Nodes {
		if out, err := s.NodeExec(context.Background(), n.Name, nil, "ctr", "-a", "/run/containerd/containerd.sock", "-n", "k8s.io",
			"images", "import", "--no-unpack", tar); err != nil {
			t.Fatalf("importing %s into %s's containerd: %v\n%s", tar, n.Name, err, out)
		}
	}
	return b
}

// thisBuild is the build under test, as the lab installed it.
func thisBuild(s *lab.State) twillBuild {
	return twillBuild{name: "this build", image: s.TwillImage, kube: dist.KubeManifest, keeper: dist.WireGuardKeeperManifest}
}

// install applies b's manifests, edited as the lab edits its own (image,
// backend, IP family), as an operator upgrades or downgrades, and waits
// until every node runs b's twilld, ready. The keeper's DaemonSet is
// OnDelete: its pods stay as they are, of whichever build started them.
func (b twillBuild) install(t *testing.T, s *lab.State) {
	t.Helper()
	m, err := lab.EditManifest(b.kube, b.keeper, b.image, s.Backend, s.Family())
	if err != nil {
		t.Fatalf("%s's manifests: %v", b.name, err)
	}
	if out, err := s.Kubectl(context.Background(), bytes.NewReader(m), "apply", "-f", "-"); err != nil {
		t.Fatalf("kubectl apply (%s): %v\n%s", b.name, err, out)
	}
	kubectl := labKubectl(t, s)
	kubectl("-n", lab.TwillNamespace, "rollout", "status", "ds/"+lab.TwillDaemonSet, "--timeout", "3m")
	waitTwillReady(t, s)
	running := kubectl("-n", lab.TwillNamespace, "get", "pods", "-l", "app.kubernetes.io/name=twill", "-o", `jsonpath={range .items[*]}{.spec.containers[0].image}{"\n"}{end}`)
	if lines := strings.Fields(running); len(lines) != len(s.Nodes) || slices.ContainsFunc(lines, func(l string) bool { return l != b.image }) {
		t.Fatalf("twill pods after installing %s (%s) run:\n%s", b.name, b.image, running)
	}
}
