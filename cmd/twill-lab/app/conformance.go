package app

import (
	"fmt"
	"io"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/twill-net/twill/lab"
)

func labConformanceCommand(o *labOptions) *cobra.Command {
	var (
		fast, listSkips, markdown bool
		reportDir, suite          string
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
out, each with its reason.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			w := cmd.OutOrStdout()
			if !slices.Contains([]string{"conformance", "netpol", "sig-network"}, suite) {
				return fmt.Errorf("--suite %q: want conformance, netpol or sig-network", suite)
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
	cmd.Flags().StringVar(&suite, "suite", "conformance", "conformance ([sig-network] [Conformance]), netpol ([sig-network] Netpol, NetworkPolicy) or sig-network (the rest of [sig-network])")
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
