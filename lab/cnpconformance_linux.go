package lab

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// CNPConformance is one run of network-policy-api's conformance suite
// against a Kubernetes lab with the ClusterNetworkPolicy CRD.
type CNPConformance struct {
	Binary string   // the suite's test binary (tools/cnp/build.sh)
	Tests  []string // the tests to run, by short name (none: all)
	// Report is where the suite writes its conformance report (YAML).
	Report  string
	Version string // twill's, for the report
	Out     io.Writer
	Timeout time.Duration
}

// RunCNPConformance runs the suite's ClusterNetworkPolicy profile, every
// experimental feature on, in the underlay namespace as the lab's admin,
// and reads its output. CNPSCTPTests never run, nor does any SCTP probe.
// The error is non-nil when the suite could not run or a test failed.
func (s *State) RunCNPConformance(ctx context.Context, c CNPConformance) (CNPOutcome, error) {
	if !s.Kubernetes {
		return CNPOutcome{}, fmt.Errorf("lab %s is not a Kubernetes lab (lab up --kubernetes)", s.Name)
	}
	if _, err := os.Stat(c.Binary); err != nil {
		return CNPOutcome{}, fmt.Errorf("network-policy-api's conformance suite (make cnp-tools builds it): %w", err)
	}
	if c.Timeout == 0 {
		c.Timeout = time.Hour
	}
	report, err := filepath.Abs(c.Report)
	if err != nil {
		return CNPOutcome{}, err
	}
	run := "^TestConformanceProfiles$"
	if len(c.Tests) > 0 {
		run += "/^(" + strings.Join(c.Tests, "|") + ")$"
	}
	args := []string{"--net=/var/run/netns/" + s.underlayNS(), c.Binary,
		"-test.run", run, "-test.skip", "^TestConformanceProfiles$/^(" + strings.Join(CNPSCTPTests, "|") + ")$",
		"-test.v", "-test.timeout", c.Timeout.String(),
		"--conformance-profiles=ClusterNetworkPolicy", "--all-features",
		"--organization=twill-net", "--project=twill", "--url=https://github.com/twill-net/twill", "--version=" + c.Version,
		"--contact=https://github.com/twill-net/twill/issues",
		"--additional-info=https://github.com/twill-net/twill/blob/main/Documentation/conformance.md (make cnp: a twillctl lab, its kernel without SCTP)",
		"--report-output=" + report}
	cmd := exec.CommandContext(ctx, "nsenter", args...)
	dir := filepath.Dir(report)
	cmd.Dir = dir
	var buf bytes.Buffer
	out := io.Writer(&buf)
	if c.Out != nil {
		out = io.MultiWriter(&buf, c.Out)
	}
	cmd.Stdout, cmd.Stderr = out, out
	cmd.Env = append(os.Environ(), "KUBECONFIG="+s.AdminKubeconfig, "HOME="+dir)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 10 * time.Second
	runErr := cmd.Run()
	o, err := ReadCNPOutput(&buf)
	if err != nil {
		return o, err
	}
	passed, failed, _ := o.Counts()
	switch {
	case passed+failed == 0:
		return o, fmt.Errorf("no test ran (%v)", runErr)
	case failed > 0:
		return o, fmt.Errorf("%d of %d tests failed", failed, passed+failed)
	case runErr != nil:
		return o, fmt.Errorf("the suite: %w", runErr)
	}
	return o, nil
}
