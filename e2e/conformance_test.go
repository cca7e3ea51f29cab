package e2e

import (
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/twill-net/twill/internal/testsupport/buildtest"
	"github.com/twill-net/twill/internal/testsupport/kubetest"
	"github.com/twill-net/twill/lab"
	"github.com/twill-net/twill/lab/ociimage"
)

// TestKubeConformanceFast runs the pod-networking subset of Kubernetes' own
// e2e suite (lab.ConformanceFast: pod to pod and node to pod over HTTP and
// UDP, a Service's endpoints, a NodePort, hairpin) and its dual-stack
// subset (lab.DualStackFast) against a dual-stack vxlan Kubernetes lab
// running twill as dist/kube-twill.yml installs it, through twillctl lab
// conformance --fast as make conformance IP_FAMILY=dual runs the whole set;
// then the NetworkPolicy subset on the same lab.
func TestKubeConformanceFast(t *testing.T) {
	l := newLabCtl(t)
	images := kubeLabImages(t, l.bin, "e2e")
	pause := buildtest.Binaries(t, "github.com/twill-net/twill/tools/pause")
	missing, err := ociimage.WriteE2EImages(filepath.Join(images, "e2e-images.tar"), kubeBinDir(t), filepath.Join(pause, "pause"),
		filepath.Join(kubetest.Root(t), "build", "debs"))
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("e2e images: %d of the suite's references have no stand-in", len(missing))
	name := labName("cf")
	l.up(name, "--kubernetes", "--nodes", "2", "--pods-per-node", "1", "--backend", "vxlan", "--ip-family", "dual",
		"--kube-bin-dir", kubeBinDir(t), "--image-dir", images)
	report := t.TempDir()
	out, err := l.run("conformance", "--name", name, "--fast", "--report-dir", report)
	if err != nil {
		t.Fatalf("lab conformance --fast: %v\n%s", err, tail(out, 200))
	}
	o, err := lab.ReadJUnitDir(report)
	if err != nil {
		t.Fatal(err)
	}
	// Every spec of the subset ran and passed: each pattern matched a
	// passed spec, and none failed.
	fast := slices.Concat(lab.ConformanceFast, lab.DualStackFast)
	for _, f := range fast {
		re := regexp.MustCompile(f)
		n := 0
		for _, s := range o.Specs {
			if re.MatchString(s.Name) && s.Status == "passed" {
				n++
			}
		}
		if n == 0 {
			t.Errorf("no passed spec matches %s; specs that ran:\n%s", f, o.Markdown("vxlan"))
		}
	}
	if o.Failed > 0 || o.Passed < 11 {
		t.Fatalf("%d passed, %d failed (want the 11 specs of the subsets):\n%s", o.Passed, o.Failed, o.Markdown("vxlan"))
	}
	t.Logf("conformance subset:\n%s", o.Markdown("vxlan"))

	// The NetworkPolicy subset, on the same lab (twill enforces policy as
	// dist/kube-twill.yml ships it).
	report = t.TempDir()
	out, err = l.run("conformance", "--name", name, "--suite", "netpol", "--fast", "--report-dir", report)
	if err != nil {
		t.Fatalf("lab conformance --suite netpol --fast: %v\n%s", err, tail(out, 200))
	}
	if o, err = lab.ReadJUnitDir(report); err != nil {
		t.Fatal(err)
	}
	for _, f := range lab.NetpolFast {
		re := regexp.MustCompile(f)
		if !slices.ContainsFunc(o.Specs, func(s lab.SpecResult) bool { return re.MatchString(s.Name) && s.Status == "passed" }) {
			t.Errorf("no passed spec matches %s; specs that ran:\n%s", f, o.Markdown("vxlan"))
		}
	}
	if o.Failed > 0 || o.Passed < len(lab.NetpolFast) {
		t.Fatalf("%d passed, %d failed (want the %d specs of the Netpol subset):\n%s", o.Passed, o.Failed, len(lab.NetpolFast), o.Markdown("vxlan"))
	}
	t.Logf("Netpol subset:\n%s", o.Markdown("vxlan"))
}

// tail is the last n lines of s.
func tail(s string, n int) string {
	lines := strings.Split(s, "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
