package lab

import (
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
)

func TestReadJUnit(t *testing.T) {
	report := `<?xml version="1.0" encoding="UTF-8"?>
<testsuites tests="5" disabled="0" errors="0" failures="1" time="10">
  <testsuite name="Kubernetes e2e suite" package="/" tests="5" skipped="2" failures="1">
    <testcase name="[SynchronizedBeforeSuite]" classname="Kubernetes e2e suite" status="passed" time="1"></testcase>
    <testcase name="[ReportBeforeSuite]" classname="Kubernetes e2e suite" status="passed" time="0"></testcase>
    <testcase name="[SynchronizedAfterSuite]" classname="Kubernetes e2e suite" status="skipped" time="0"><skipped message="skipped"></skipped></testcase>
    <testcase name="[It] [sig-network] DNS should provide DNS for services [Conformance]" classname="Kubernetes e2e suite" status="passed" time="3"></testcase>
    <testcase name="[It] [sig-network] Services should serve a basic endpoint from pods [Conformance]" classname="Kubernetes e2e suite" status="failed" time="3">
      <failure message="timed out" type="failed">timed out</failure>
    </testcase>
    <testcase name="[It] [sig-apps] Deployment should run" classname="Kubernetes e2e suite" status="skipped" time="0"><skipped message="skipped"></skipped></testcase>
    <testcase name="[It] [sig-network] HostPort validates | pipes" classname="Kubernetes e2e suite" status="pending" time="0"><skipped message="pending"></skipped></testcase>
  </testsuite>
</testsuites>`
	o, err := ReadJUnit(strings.NewReader(report))
	if err != nil {
		t.Fatal(err)
	}
	if o.Passed != 1 || o.Failed != 1 || o.Skipped != 2 || len(o.Specs) != 2 {
		t.Fatalf("outcome %+v: want 1 passed, 1 failed, 2 skipped, 2 specs (suite setup not counted)", o)
	}
	if o.Specs[0].Name != "[sig-network] DNS should provide DNS for services [Conformance]" || o.Specs[1].Status != "failed" {
		t.Fatalf("specs %+v", o.Specs)
	}
	md := o.Markdown("vxlan")
	if !strings.Contains(md, "| [sig-network] Services should serve a basic endpoint from pods [Conformance] | failed |") ||
		!strings.Contains(md, "1 passed, 1 failed, 2 skipped") {
		t.Fatalf("markdown:\n%s", md)
	}
	// A failed suite node failed the run: it counts, and is listed.
	failedSetup := strings.Replace(report, `<testcase name="[SynchronizedBeforeSuite]" classname="Kubernetes e2e suite" status="passed" time="1"></testcase>`,
		`<testcase name="[SynchronizedBeforeSuite]" classname="Kubernetes e2e suite" status="failed" time="1"><failure message="no nodes">no nodes</failure></testcase>`, 1)
	if o, err := ReadJUnit(strings.NewReader(failedSetup)); err != nil || o.Failed != 2 || o.Specs[0].Name != "[SynchronizedBeforeSuite]" {
		t.Fatalf("a failed [SynchronizedBeforeSuite]: %+v %v; want it counted and listed", o, err)
	}
	if _, err := ReadJUnit(strings.NewReader("not xml")); err == nil || !strings.Contains(err.Error(), "JUnit") {
		t.Fatalf("a broken report: err = %v", err)
	}
}

// Every pattern compiles (ginkgo reads them as Go regular expressions) and
// has its reason; the skips leave the fast subset's specs alone.
func TestConformancePatterns(t *testing.T) {
	for _, s := range SuiteSkips("sig-network") {
		if _, err := regexp.Compile(s.Pattern); err != nil || s.Reason == "" {
			t.Errorf("skip %q: %v, reason %q", s.Pattern, err, s.Reason)
		}
	}
	skip := regexp.MustCompile(SkipRegexp(ConformanceSkips))
	for _, f := range slices.Concat(ConformanceFocus, ConformanceFast, NetpolFocus, NetpolFast, SigNetworkFocus) {
		if _, err := regexp.Compile(f); err != nil {
			t.Errorf("focus %q: %v", f, err)
		}
	}
	for _, name := range []string{
		"[sig-network] Networking Granular Checks: Pods should function for intra-pod communication: http [NodeConformance] [Conformance]",
		"[sig-network] Services should serve a basic endpoint from pods [Conformance]",
		"[sig-network] DNS should provide DNS for services [Conformance]",
		"[sig-network] Netpol NetworkPolicy between server and client should support a 'default-deny-ingress' policy [Feature:NetworkPolicy]",
		"[sig-network] Netpol NetworkPolicy between server and client should not mistakenly treat 'protocol: SCTP' as 'protocol: TCP', even if the plugin doesn't support SCTP [Feature:NetworkPolicy]",
	} {
		if skip.MatchString(name) {
			t.Errorf("the skip list leaves out %q", name)
		}
	}
	// The sig-network suite runs what the other two do not, and leaves
	// them to those.
	wide := regexp.MustCompile(SkipRegexp(SuiteSkips("sig-network")))
	for name, skipped := range map[string]bool{
		"[sig-network] Services should be able to up and down services":                                                          false,
		"[sig-network] KubeProxy should set TCP CLOSE_WAIT timeout [Privileged]":                                                 false,
		"[sig-network] Conntrack proxy implementation should not be vulnerable to the invalid conntrack state bug [Privileged]":  false,
		"[sig-network] Services should serve a basic endpoint from pods [Conformance]":                                           true,
		"[sig-network] Netpol API should support creating NetworkPolicy API operations":                                          true,
		"[sig-network] LoadBalancers should be able to change the type and ports of a TCP service [Slow] [Feature:LoadBalancer]": true,
		"[sig-network] Services should work with the pod containing more than 6 DNS search paths [Flaky]":                        true,
	} {
		if wide.MatchString(name) != skipped {
			t.Errorf("--suite sig-network skips %q: %v, want %v", name, !skipped, skipped)
		}
	}
}

// Documentation/conformance.md lists every skip with its reason, as the
// code has them.
func TestConformanceSkipsDocumented(t *testing.T) {
	doc, err := os.ReadFile("../Documentation/conformance.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range SuiteSkips("sig-network") {
		row := "| `" + strings.ReplaceAll(s.Pattern, "|", `\|`) + "` | " + s.Reason + " |"
		if !strings.Contains(string(doc), row) {
			t.Errorf("Documentation/conformance.md has no row\n%s", row)
		}
	}
}

// A skip for one backend, or one IP family, leaves other backends' and
// families' runs alone.
func TestSkipsFor(t *testing.T) {
	skips := []Skip{{Pattern: "a", Reason: "everywhere"}, {Pattern: "b", Reason: "overlay only", Backends: []string{"vxlan"}},
		{Pattern: "c", Reason: "IPv4 labs only", Families: []string{"ipv4"}}}
	for _, tc := range []struct{ backend, family, want string }{
		{"vxlan", "ipv4", "a|b|c"},
		{"host-gw", "ipv4", "a|c"},
		{"vxlan", "dual", "a|b"},
		{"host-gw", "ipv6", "a"},
	} {
		if got := SkipRegexp(SkipsFor(skips, tc.backend, tc.family)); got != tc.want {
			t.Errorf("%s, %s skips %q, want %q", tc.backend, tc.family, got, tc.want)
		}
	}
}
