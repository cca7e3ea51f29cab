package lab

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"time"
)

// Conformance is one run of Kubernetes' e2e suite against the lab.
type Conformance struct {
	Focus     []string      // a spec runs when it matches any of these
	Skips     []Skip        // those for other backends than the lab's are left out
	ReportDir string        // where e2e.test writes its JUnit report
	Out       io.Writer     // e2e.test's output
	Timeout   time.Duration // the suite's own limit (ginkgo.timeout)
}

// RunConformance runs e2e.test (built next to the lab's Kubernetes
// binaries, at their version) in the underlay namespace, where the control
// plane is, as the lab's admin, and reads its report. The error is
// non-nil when the suite failed or a spec did.
func (s *State) RunConformance(ctx context.Context, c Conformance) (Outcome, error) {
	if !s.Kubernetes {
		return Outcome{}, fmt.Errorf("lab %s is not a Kubernetes lab (lab up --kubernetes)", s.Name)
	}
	e2e := filepath.Join(s.KubeBinDir, "e2e.test")
	if _, err := os.Stat(e2e); err != nil {
		return Outcome{}, fmt.Errorf("no e2e.test (make kube-tools builds it): %w", err)
	}
	// Absolute: e2e.test runs in the report directory.
	dir, err := filepath.Abs(c.ReportDir)
	if err != nil {
		return Outcome{}, err
	}
	c.ReportDir = dir
	if err := os.MkdirAll(c.ReportDir, 0o755); err != nil {
		return Outcome{}, err
	}
	if c.Timeout == 0 {
		c.Timeout = 2 * time.Hour
	}
	args := []string{"--net=/var/run/netns/" + s.underlayNS(), e2e,
		"--kubeconfig=" + s.AdminKubeconfig, "--provider=skeleton",
		"--kubectl-path=" + filepath.Join(s.KubeBinDir, "kubectl"),
		"--num-nodes=" + strconv.Itoa(len(s.Nodes)), "--allowed-not-ready-nodes=0",
		"--report-dir=" + c.ReportDir, "--e2e-output-dir=" + c.ReportDir, "--disable-log-dump",
		"--ginkgo.no-color", "--ginkgo.silence-skips", "--ginkgo.timeout=" + c.Timeout.String()}
	for _, f := range c.Focus {
		args = append(args, "--ginkgo.focus="+f)
	}
	if skips := SkipsFor(c.Skips, s.Backend, s.Family()); len(skips) > 0 {
		args = append(args, "--ginkgo.skip="+SkipRegexp(skips))
	}
	cmd := exec.CommandContext(ctx, "nsenter", args...)
	cmd.Dir = c.ReportDir
	cmd.Stdout, cmd.Stderr = c.Out, c.Out
	cmd.Env = append(os.Environ(), "KUBECONFIG="+s.AdminKubeconfig, "HOME="+c.ReportDir)
	// Its own process group, so a cancelled run stops it and all it ran.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 10 * time.Second
	runErr := cmd.Run()
	o, err := ReadJUnitDir(c.ReportDir)
	switch {
	case err != nil && runErr != nil:
		return o, fmt.Errorf("e2e.test: %w (and %v)", runErr, err)
	case err != nil:
		return o, err
	case runErr != nil:
		return o, fmt.Errorf("e2e.test: %w (%d passed, %d failed)", runErr, o.Passed, o.Failed)
	case o.Failed > 0:
		return o, fmt.Errorf("%d of %d specs failed", o.Failed, o.Passed+o.Failed)
	case o.Passed == 0:
		return o, fmt.Errorf("no spec ran: the focus %q selected none", c.Focus)
	}
	return o, nil
}
