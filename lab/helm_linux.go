package lab

import (
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"time"
)

// helmInstall installs twill with helm install from the embedded
// dist/chart/twill, with the lab's image, backend and IP family (and
// o.HelmSet), and waits for it as the kubectl install does.
func (s *State) helmInstall(ctx context.Context, o Options, step func(string, ...any)) error {
	chart, err := writeChart(s.Dir)
	if err != nil {
		return err
	}
	args := append([]string{"install", HelmRelease, chart}, HelmValues(s.TwillImage, o.Backend, s.IPFamily, o.HelmSet)...)
	step("twill: helm install %s dist/chart/twill (image %s)", HelmRelease, s.TwillImage)
	if out, err := s.Helm(ctx, args...); err != nil {
		return fmt.Errorf("helm install: %w\n%s", err, out)
	}
	if err := s.save(); err != nil {
		return err
	}
	return s.waitTwill(ctx)
}

// HelmCommand is helm, as the lab's admin, in the namespace that reaches
// the lab's apiserver (see helmEnv).
func (s *State) HelmCommand(args ...string) (*exec.Cmd, error) {
	if s.HelmBin == "" {
		return nil, fmt.Errorf("lab %q has no helm (make helm-tools, then lab up --kubernetes, or --helm-bin)", s.Name)
	}
	full := append([]string{"netns", "exec", s.UnderlayNS(), "env"}, s.helmEnv()...)
	return exec.Command("ip", append(append(full, s.HelmBin), args...)...), nil
}

// Helm runs helm as the lab's admin and returns its output (stdout, then
// stderr).
func (s *State) Helm(ctx context.Context, args ...string) (string, error) {
	c, err := s.HelmCommand(args...)
	if err != nil {
		return "", err
	}
	cctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(cctx, c.Path, c.Args[1:]...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err = cmd.Run()
	return out.String(), err
}
