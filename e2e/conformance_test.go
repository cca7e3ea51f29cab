package e2e

import (
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/twill-net/twill/lab"
	"github.com/twill-net/twill/testsupport/kubetest"
)

// TestKubeConformanceFast runs the pod-networking subset of Kubernetes' own
// e2e suite (lab.ConformanceFast: pod to pod and node to pod over HTTP and
// UDP, a Service's endpoints, a NodePort, hairpin, host ports) and its dual-stack
// subset (lab.DualStackFast) against a dual-stack vxlan Kubernetes lab
// running twill as dist/kube-twill.yml installs it, through twillctl lab
// conformance --fast as make conformance IP_FAMILY=dual runs the whole set;
// then the NetworkPolicy subset on the same lab.
func TestKubeConformanceFast(t *testing.T) {
	l, images := conformanceImages(t)
	name := conformanceLab(t, l, images, "cf")
	// The subsets run one after the other: side by side they saved about
	// 20 s, and the Netpol specs' pods and probes loaded the nodes enough
	// that the dual-stack spec's first curl, which upstream sends the
	// moment its server's container has started, once found nothing
	// listening yet (on a fresh machine, 2026-11-26).
	outcomes := make([]lab.Outcome, 2)
	errs := make([]error, 2)
	for i, suite := range []string{"conformance", "netpol"} {
		outcomes[i], errs[i] = runFast(l, name, suite, t.TempDir())
	}
	if errs[0] != nil || errs[1] != nil {
		t.Fatal(errors.Join(errs...))
	}
	// Every spec of each subset ran and passed: each pattern matched a
	// passed spec, and none failed.
	checkFast(t, "conformance", outcomes[0], slices.Concat(lab.ConformanceFast, lab.DualStackFast), 12)
	checkFast(t, "Netpol", outcomes[1], lab.NetpolFast, len(lab.NetpolFast))
}

// TestKubeClusterNetworkPolicyConformance runs network-policy-api's
// ClusterNetworkPolicy subset (lab.CNPFast), as make cnp runs its suite,
// against a lab like TestKubeConformanceFast's, a lab of its own so that
// the two run side by side (they once ran one after the other on one lab,
// the longest test of the end-to-end tier, which it ended alone).
func TestKubeClusterNetworkPolicyConformance(t *testing.T) {
	l, images := conformanceImages(t)
	name := conformanceLab(t, l, images, "cc")
	out, err := l.run("conformance", "--name", name, "--suite", "cnp", "--fast", "--markdown", "--report-dir", t.TempDir(),
		"--cnp-suite", kubetest.ClusterPolicySuite(t))
	want := fmt.Sprintf(": %d passed, 0 failed;", len(lab.CNPFast))
	if err != nil || !strings.Contains(out, want) {
		t.Fatalf("lab conformance --suite cnp --fast (%v), want %q:\n%s", err, want, tail(out, 200))
	}
	t.Logf("ClusterNetworkPolicy subset:\n%s", tail(out, len(lab.CNPFast)+4))
}

// conformanceImages runs t in the Kubernetes labs' lane once the e2e
// suite's image stand-ins are written (at the lowest priority, while the
// lane's earlier tests run), and returns them.
func conformanceImages(t *testing.T) (*labCtl, string) {
	var l *labCtl
	var images string
	kubeLabAfter(t, func() {
		l = newLabCtl(t)
		images = labImagesNiced(t, l.bin, e2eImages, "e2e")
	})
	return l, images
}

// conformanceLab brings up a dual-stack vxlan Kubernetes lab with the e2e
// suite's image stand-ins and the ClusterNetworkPolicy CRDs, and returns
// its name.
func conformanceLab(t *testing.T, l *labCtl, images, prefix string) string {
	name := labName(prefix)
	l.up(name, "--kubernetes", "--nodes", "2", "--pods-per-node", "1", "--backend", "vxlan", "--ip-family", "dual",
		"--kube-bin-dir", kubeBinDir(t), "--image-dir", images, "--crd", kubetest.ClusterPolicyCRD(t))
	return name
}

// runFast runs lab conformance --fast of suite on the lab and reads its
// report.
func runFast(l *labCtl, name, suite, report string) (lab.Outcome, error) {
	out, err := l.run("conformance", "--name", name, "--suite", suite, "--fast", "--report-dir", report)
	if err != nil {
		return lab.Outcome{}, fmt.Errorf("lab conformance --suite %s --fast: %w\n%s", suite, err, tail(out, 200))
	}
	return lab.ReadJUnitDir(report)
}

// checkFast fails unless each pattern of the subset matched a passed spec,
// none failed and at least want passed.
func checkFast(t *testing.T, subset string, o lab.Outcome, patterns []string, want int) {
	t.Helper()
	for _, f := range patterns {
		re := regexp.MustCompile(f)
		if !slices.ContainsFunc(o.Specs, func(s lab.SpecResult) bool { return re.MatchString(s.Name) && s.Status == "passed" }) {
			t.Errorf("no passed spec matches %s; specs that ran:\n%s", f, o.Markdown("vxlan"))
		}
	}
	if o.Failed > 0 || o.Passed < want {
		t.Fatalf("%s subset: %d passed, %d failed (want its %d specs):\n%s", subset, o.Passed, o.Failed, want, o.Markdown("vxlan"))
	}
	t.Logf("%s subset:\n%s", subset, o.Markdown("vxlan"))
}

// tail is the last n lines of s.
func tail(s string, n int) string {
	lines := strings.Split(s, "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
