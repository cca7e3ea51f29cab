package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/twill-net/twill/lab"
)

// checkKubeVerdicts: in the Kubernetes lab, a connection from denied to
// target, which a policy isolates, is in twillctl policy log on target's
// node within 2 s, naming both pods, the port and the policy; a connection
// from allowed is not logged (namespace lab does not ask for it).
func checkKubeVerdicts(t *testing.T, s *lab.State, bin string, reaches func(from, to lab.Pod) bool, allowed, denied, target lab.Pod, policy string) {
	t.Helper()
	policyLog := func() string {
		out, err := s.NodeExec(context.Background(), target.Node, nil, bin+"/twillctl", "policy", "log",
			"--endpoint", fmt.Sprintf("http://127.0.0.1:%d", lab.HealthzPort), "--pod", "lab/"+target.Name)
		if err != nil {
			t.Fatalf("twillctl policy log on %s: %v\n%s", target.Node, err, out)
		}
		return out
	}
	want := fmt.Sprintf("denied ingress lab/%s (%s) -> lab/%s (%s) %d/tcp: deny ingress lab/%s: no rule of %s allows it",
		denied.Name, denied.IP, target.Name, target.IP, lab.EchoPort, target.Name, policy)
	start := time.Now()
	if reaches(denied, target) {
		t.Fatalf("%s reaches %s, which %s isolates", denied.Label(), target.Label(), policy)
	}
	var seen time.Duration
	waitFor(t, 30*time.Second, "the denied connection in twillctl policy log", func() bool {
		ok := strings.Contains(policyLog(), want)
		seen = time.Since(start)
		return ok
	})
	t.Logf("%s's denied connection to %s in twillctl policy log %s after the attempt began", denied.Label(), target.Label(), seen.Round(time.Millisecond))
	if seen > 2*time.Second {
		t.Errorf("the denied connection reached twillctl policy log after %s, want within 2 s", seen)
	}
	if !reaches(allowed, target) {
		t.Fatalf("%s cannot reach %s", allowed.Label(), target.Label())
	}
	time.Sleep(time.Second) // as long as a record takes, and more
	if out := policyLog(); strings.Contains(out, " allowed ") || strings.Contains(out, "lab/"+allowed.Name+" (") {
		t.Errorf("an allowed connection was logged, in a namespace that did not ask:\n%s", out)
	}
}
