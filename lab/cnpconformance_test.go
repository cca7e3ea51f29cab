package lab

import (
	"strings"
	"testing"
)

func TestReadCNPOutput(t *testing.T) {
	out := `=== RUN   TestConformanceProfiles
=== RUN   TestConformanceProfiles/CNPAdminTierGress
=== RUN   TestConformanceProfiles/CNPAdminTierGress/Should_support
    helper.go:70: SCTP probe of 10.244.2.15:9003 not run: no SCTP in this kernel
    helper.go:70: SCTP probe of 10.244.2.16:9003 not run: no SCTP in this kernel
=== RUN   TestConformanceProfiles/CNPAdminTierIngressTCP
=== RUN   TestConformanceProfiles/CNPAdminTierIngressTCP/deny
    helper.go:71: FAILED Command was [/agnhost connect --timeout=3s --protocol=tcp 10.244.1.18:80]
=== RUN   TestConformanceProfiles/CNPAdminTierPodSelector
--- FAIL: TestConformanceProfiles (948.46s)
    --- PASS: TestConformanceProfiles/CNPAdminTierGress (65.05s)
        --- PASS: TestConformanceProfiles/CNPAdminTierGress/Should_support (11.01s)
    --- FAIL: TestConformanceProfiles/CNPAdminTierIngressTCP (34.49s)
    --- PASS: TestConformanceProfiles/CNPAdminTierPodSelector (50.05s)
`
	o, err := ReadCNPOutput(strings.NewReader(out))
	if err != nil {
		t.Fatal(err)
	}
	p, f, s := o.Counts()
	if p != 2 || f != 1 || s != 1 {
		t.Fatalf("counts %d %d %d, want 2 1 1: %+v", p, f, s, o.Tests)
	}
	if o.Tests[0].SCTPNotRun != 2 || o.Tests[1].Failed[0] != "tcp 10.244.1.18:80" {
		t.Errorf("%+v", o.Tests)
	}
}
