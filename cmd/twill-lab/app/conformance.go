package app

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/twill-net/twill/internal/version"
	"github.com/twill-net/twill/lab"
)

func labConformanceCommand(o *labOptions) *cobra.Command {
	var (
		fast, listSkips, markdown bool
		reportDir, suite, cnpBin  string
		focus                     []string
		timeout                   time.Duration
	)
	cmd := &cobra.Command{
		Use:   "conformance",
		Short: "Run Kubernetes' own network conformance specs (e2e.test) against a Kubernetes lab; exit 1 if any fails",
		Long: `Runs e2e.test, built at the lab's Kubernetes version by make kube-tools, in the
lab's underlay namespace as the lab's admin: by default every [sig-network]
[Conformance] spec, with --fast the pod-networking subset make test runs;
with --suite netpol every [sig-network] Netpol (NetworkPolicy) spec, with
--fast the subset make test runs; with --suite sig-network the rest of
[sig-network] (neither [Conformance] nor Netpol, nor [Feature:*], [Slow]
or [Flaky]). On a dual-stack lab (lab up --ip-family dual) the conformance
suite adds the [Feature:IPv6DualStack] specs (with --fast, a subset).
The skip list (--list-skips, per suite) is the one place specs are left
out, each with its reason.

With --suite cnp it runs network-policy-api's own conformance suite
instead (make cnp-tools builds it): its ClusterNetworkPolicy profile, the
experimental features on, with --fast the subset make test runs. This
machine's kernel has no SCTP: the suite's SCTP tests are left out, and
the other tests' SCTP probes are logged and not run (counted per test).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			w := cmd.OutOrStdout()
			if !slices.Contains([]string{"conformance", "netpol", "sig-network", "cnp"}, suite) {
				return fmt.Errorf("--suite %q: want conformance, netpol, sig-network or cnp", suite)
			}
			if suite == "cnp" {
				return runCNP(cmd, o, cnpBin, reportDir, fast, markdown, focus, timeout)
			}
			if listSkips {
				printSkips(w, suite)
				return nil
			}
			s, err := lab.Load(o.StateRoot, o.Name)
			if err != nil {
				return err
			}
			suiteFocus, err := focusFor(suite, fast, s.Family())
			if err != nil {
				return err
			}
			c := lab.Conformance{Focus: suiteFocus, Skips: lab.SuiteSkips(suite), Out: w, Timeout: timeout,
				ReportDir: reportDir}
			if len(focus) > 0 {
				c.Focus = focus
			}
			if c.ReportDir == "" {
				c.ReportDir = filepath.Join(s.Dir, "conformance-"+time.Now().Format("20060102-150405"))
			}
			out, err := s.RunConformance(cmd.Context(), c)
			fmt.Fprintf(w, "\nconformance (%s, %s, %d nodes): %d passed, %d failed, %d skipped; report in %s\n",
				s.Backend, s.Family(), len(s.Nodes), out.Passed, out.Failed, out.Skipped, c.ReportDir)
			if markdown {
				fmt.Fprint(w, "\n"+out.Markdown(s.Backend))
			}
			return err
		},
	}
	cmd.Flags().BoolVar(&fast, "fast", false, "run only the suite's subset that make test runs")
	cmd.Flags().StringVar(&suite, "suite", "conformance", "conformance ([sig-network] [Conformance]), netpol ([sig-network] Netpol, NetworkPolicy), sig-network (the rest of [sig-network]) or cnp (network-policy-api's ClusterNetworkPolicy suite)")
	cmd.Flags().StringVar(&cnpBin, "cnp-suite", "", "with --suite cnp: the suite's test binary (default: build/cnp/current/conformance-nosctp.test next to bin/)")
	cmd.Flags().StringArrayVar(&focus, "focus", nil, "run the specs matching this regular expression instead (repeatable)")
	cmd.Flags().BoolVar(&listSkips, "list-skips", false, "print every skip pattern and its reason, and exit")
	cmd.Flags().BoolVar(&markdown, "markdown", false, "also print the specs that ran as a Markdown table")
	cmd.Flags().StringVar(&reportDir, "report-dir", "", "where e2e.test writes its JUnit report (default: a new directory in the lab's state)")
	cmd.Flags().DurationVar(&timeout, "timeout", 2*time.Hour, "the suite's own time limit")
	return cmd
}

// printSkips lists a suite's skip patterns, each with its reason and, when
// it applies only to some backends or IP families, which.
func printSkips(w io.Writer, suite string) {
	for _, s := range lab.SuiteSkips(suite) {
		only := ""
		if on := slices.Concat(s.Backends, s.Families); len(on) > 0 {
			only = "\t(" + strings.Join(on, ", ") + " only)"
		}
		fmt.Fprintf(w, "%s\t%s%s\n", s.Pattern, s.Reason, only)
	}
}

// focusFor is the specs a suite runs on a lab of the given IP family: a
// dual-stack lab's conformance suite runs the dual-stack specs too.
func focusFor(suite string, fast bool, family string) ([]string, error) {
	var focus []string
	switch {
	case suite == "sig-network" && fast:
		return nil, fmt.Errorf("--suite sig-network has no --fast subset (make test runs those of conformance and netpol)")
	case suite == "sig-network":
		return lab.SigNetworkFocus, nil
	case suite == "netpol" && fast:
		return lab.NetpolFast, nil
	case suite == "netpol":
		return lab.NetpolFocus, nil
	case fast:
		focus = lab.ConformanceFast
	default:
		focus = lab.ConformanceFocus
	}
	if family != "dual" {
		return focus, nil
	}
	if fast {
		return slices.Concat(focus, lab.DualStackFast), nil
	}
	return slices.Concat(focus, lab.DualStackFocus), nil
}

// runCNP is lab conformance --suite cnp: network-policy-api's suite, its
// report written in the report directory (conformance-report.yaml).
func runCNP(cmd *cobra.Command, o *labOptions, bin, reportDir string, fast, markdown bool, focus []string, timeout time.Duration) error {
	w := cmd.OutOrStdout()
	s, err := lab.Load(o.StateRoot, o.Name)
	if err != nil {
		return err
	}
	if bin == "" {
		bin = filepath.Join(binDir(), "..", "build", "cnp", "current", "conformance-nosctp.test")
	}
	if reportDir == "" {
		reportDir = filepath.Join(s.Dir, "cnp-"+time.Now().Format("20060102-150405"))
	}
	if err := os.MkdirAll(reportDir, 0o755); err != nil {
		return err
	}
	c := lab.CNPConformance{Binary: bin, Report: filepath.Join(reportDir, "conformance-report.yaml"), Version: version.Version, Out: w, Timeout: timeout, Tests: focus}
	if fast && len(focus) == 0 {
		c.Tests = lab.CNPFast
	}
	out, err := s.RunCNPConformance(cmd.Context(), c)
	passed, failed, sctp := out.Counts()
	fmt.Fprintf(w, "\nClusterNetworkPolicy conformance (%s, %s, %d nodes): %d passed, %d failed; %d passed with their SCTP probes not run and %d SCTP tests not run (no SCTP in this kernel); report in %s\n",
		s.Backend, s.Family(), len(s.Nodes), passed, failed, sctp, len(lab.CNPSCTPTests), c.Report)
	if markdown {
		fmt.Fprint(w, "\n"+out.Markdown(s.Backend))
	}
	return err
}
