// Package netnstest makes network namespaces for tests. Names carry a
// per-process random run ID so two runs never collide, and every namespace
// is removed in t.Cleanup, on failure too. Nothing here touches the
// namespace the test runs in.
package netnstest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/containernetworking/plugins/pkg/ns"
)

var (
	runOnce sync.Once
	runID   string
	seq     atomic.Int64
)

// RunID is this process's random namespace-name prefix component.
func RunID() string {
	runOnce.Do(func() {
		b := make([]byte, 3)
		if _, err := rand.Read(b); err != nil {
			panic(err)
		}
		runID = hex.EncodeToString(b)
	})
	return runID
}

// RequireRoot skips t when not running as root, saying why. Under CI
// (CI=true), where the suite always runs as root, it fails instead, so that
// privileged tests are never silently skipped there.
//
// In -short mode (the unit tier, make test-unit) privileged tests are
// skipped with a message naming the tier that runs them.
func RequireRoot(t testing.TB) {
	t.Helper()
	if testing.Short() {
		t.Skip("privileged test: not part of the unit tier (-short); make test-privileged runs it as root")
	}
	if os.Geteuid() == 0 {
		if _, err := exec.LookPath("ip"); err != nil {
			t.Fatalf("privileged test needs iproute2's ip command: %v (run make setup)", err)
		}
		return
	}
	if os.Getenv("CI") == "true" {
		t.Fatalf("privileged test needs root, and CI must run it as root")
	}
	t.Skip("privileged test: needs root to create network namespaces (run `sudo make test-privileged`)")
}

// New creates a namespace named tw<run>-<role><n> with lo up and returns its
// name; it is deleted when the test ends.
func New(t testing.TB, role string) string {
	t.Helper()
	RequireRoot(t)
	name := fmt.Sprintf("tw%s-%s%d", RunID(), role, seq.Add(1))
	if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add %s: %v: %s", name, err, out)
	}
	t.Cleanup(func() { Delete(name) })
	IP(t, name, "link", "set", "lo", "up")
	return name
}

// Delete removes a namespace; a missing one is fine.
func Delete(name string) {
	_ = exec.Command("ip", "netns", "del", name).Run()
}

// IP runs `ip -n ns args...` and fails the test on error.
func IP(t testing.TB, ns string, args ...string) string {
	t.Helper()
	out, err := exec.Command("ip", append([]string{"-n", ns}, args...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("ip -n %s %s: %v: %s", ns, strings.Join(args, " "), err, out)
	}
	return string(out)
}

// Exec runs a command inside ns and returns its combined output.
func Exec(ns string, name string, args ...string) (string, error) {
	out, err := exec.Command("ip", append([]string{"netns", "exec", ns, name}, args...)...).CombinedOutput()
	return string(out), err
}

// Veth creates a veth pair with one end in each namespace.
func Veth(t testing.TB, nsA, ifA, nsB, ifB string) {
	t.Helper()
	IP(t, nsA, "link", "add", ifA, "type", "veth", "peer", "name", ifB, "netns", nsB)
	IP(t, nsA, "link", "set", ifA, "up")
	IP(t, nsB, "link", "set", ifB, "up")
}

// Uplink gives ns an "eth0" (a veth whose peer, "eth0p", stays in ns too,
// so the link has carrier) with address addr (CIDR), both ends up. It is
// the node uplink most privileged tests need.
func Uplink(t testing.TB, ns, addr string) {
	t.Helper()
	IP(t, ns, "link", "add", "eth0", "type", "veth", "peer", "name", "eth0p")
	IP(t, ns, "link", "set", "eth0p", "up")
	IP(t, ns, "link", "set", "eth0", "up")
	IP(t, ns, "addr", "add", addr, "dev", "eth0")
}

// WatchIn wraps a change watch (nl.WatchNftables, say) so that its socket
// is opened inside target: a goroutine the watch's caller starts does not
// inherit the namespace of the thread it came from.
func WatchIn(target ns.NetNS, watch func(ctx context.Context, subscribed, changed func()) error) func(context.Context, func(), func()) error {
	return func(ctx context.Context, subscribed, changed func()) error {
		var err error
		_ = target.Do(func(ns.NetNS) error { err = watch(ctx, subscribed, changed); return nil })
		return err
	}
}
