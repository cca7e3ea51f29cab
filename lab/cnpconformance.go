package lab

import (
	"bufio"
	"fmt"
	"io"
	"regexp"
	"slices"
	"strings"
)

// network-policy-api's conformance suite (ClusterNetworkPolicy profile),
// as tools/cnp/build.sh builds it: what `make cnp` runs.

// CNPSCTPTests are the suite's tests of SCTP alone, left out of every run:
// this machine's kernel has no SCTP (tools/cnp/build.sh).
var CNPSCTPTests = []string{"CNPAdminTierIngressSCTP", "CNPAdminTierEgressSCTP", "CNPBaselineTierIngressSCTP", "CNPBaselineTierEgressSCTP"}

// CNPFast is the subset `make test` runs: each action of the Admin tier
// over TCP, the Baseline tier over UDP, and the tiers with NetworkPolicy
// between them.
var CNPFast = []string{"CNPAdminTierIngressTCP", "CNPBaselineTierEgressUDP", "CNPAdminTierIntegration"}

// CNPTest is one test of the suite and how it ended.
type CNPTest struct {
	Name   string // its short name
	Passed bool
	// SCTPNotRun counts its SCTP probes, logged and not run (the build's
	// PokeServer: no SCTP in this kernel).
	SCTPNotRun int
	// Failed are the probes that failed ("tcp 10.244.1.5:80"), at most a
	// few.
	Failed []string
}

// CNPOutcome is a run of the suite, read from its verbose output.
type CNPOutcome struct {
	Tests []CNPTest
}

// Counts are the tests that passed (withSCTP of them with SCTP probes not
// run) and failed.
func (o CNPOutcome) Counts() (passed, failed, withSCTP int) {
	for _, t := range o.Tests {
		if !t.Passed {
			failed++
			continue
		}
		passed++
		if t.SCTPNotRun > 0 {
			withSCTP++
		}
	}
	return passed, failed, withSCTP
}

var (
	cnpResult = regexp.MustCompile(`^    --- (PASS|FAIL): TestConformanceProfiles/(\S+) `)
	cnpRun    = regexp.MustCompile(`^=== (?:RUN|NAME|CONT|PAUSE)\s+TestConformanceProfiles/([^/\s]+)`)
	cnpProbe  = regexp.MustCompile(`FAILED Command was \[/agnhost connect --timeout=\S+ --protocol=(\S+) (\S+)\]`)
	cnpSCTP   = regexp.MustCompile(`SCTP probe of \S+ not run`)
)

// ReadCNPOutput reads the suite's `go test -v` output.
func ReadCNPOutput(r io.Reader) (CNPOutcome, error) {
	var o CNPOutcome
	probes, sctp := map[string][]string{}, map[string]int{}
	cur := ""
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if m := cnpRun.FindStringSubmatch(line); m != nil {
			cur = m[1]
		}
		if m := cnpProbe.FindStringSubmatch(line); m != nil && cur != "" {
			probes[cur] = append(probes[cur], m[1]+" "+m[2])
		}
		if cur != "" && cnpSCTP.MatchString(line) {
			sctp[cur]++
		}
		if m := cnpResult.FindStringSubmatch(line); m != nil {
			t := CNPTest{Name: m[2], Passed: m[1] == "PASS", SCTPNotRun: sctp[m[2]]}
			if !t.Passed {
				p := probes[t.Name]
				slices.Sort(p)
				t.Failed = slices.Compact(p)
				if len(t.Failed) > 4 {
					t.Failed = t.Failed[:4]
				}
			}
			o.Tests = append(o.Tests, t)
		}
	}
	return o, sc.Err()
}

// Markdown is the run as a table: one row per test.
func (o CNPOutcome) Markdown(backend string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "| test (%s) | result | SCTP probes not run | probes that failed |\n|---|---|---|---|\n", backend)
	for _, t := range o.Tests {
		res := "passed"
		if !t.Passed {
			res = "**failed**"
		}
		fmt.Fprintf(&b, "| %s | %s | %d | %s |\n", t.Name, res, t.SCTPNotRun, strings.Join(t.Failed, ", "))
	}
	return b.String()
}
