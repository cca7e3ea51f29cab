package daemon_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/twill-net/twill/backend"
	"github.com/twill-net/twill/daemon"
	"github.com/twill-net/twill/network"
	"github.com/twill-net/twill/nl"
	"github.com/twill-net/twill/subnet"
	"github.com/twill-net/twill/testsupport/logtest"
	"github.com/twill-net/twill/testsupport/netnstest"
)

// registry is this test's own registry: the test package registers a
// backend from init(), as a third-party package would, without touching
// backend.Default.
var registry = &backend.Registry{}

func init() { registry.Register("recorder", newRecorder) }

// recorder is a backend that writes down what the daemon handed it.
type recorder struct {
	cfg struct{ Greeting string }
	out string
}

type record struct {
	Greeting string
	Local    string
	Peers    []string
}

func newRecorder(o backend.Options) (backend.Backend, error) {
	r := &recorder{out: os.Getenv("TWILL_RECORD")}
	if err := backend.DecodeConfig(o.Config.Backend, &r.cfg); err != nil {
		return nil, err
	}
	return r, nil
}

func (r *recorder) Prepare(context.Context) (subnet.LeaseAttrs, error) {
	return subnet.LeaseAttrs{PublicIP: netip.MustParseAddr("192.168.80.1"), BackendType: "recorder"}, nil
}

func (r *recorder) Attach(_ context.Context, l subnet.Lease) (backend.Attached, error) {
	n := &recorderNet{r: r, local: l}
	return backend.Attached{Network: n, Watcher: n}, nil
}

type recorderNet struct {
	r     *recorder
	local subnet.Lease
}

func (n *recorderNet) MTU() int { return 1234 }

func (n *recorderNet) Reconcile(_ context.Context, peers []subnet.Lease) error {
	rec := record{Greeting: n.r.cfg.Greeting, Local: n.local.Subnet.String()}
	for _, p := range peers {
		rec.Peers = append(rec.Peers, p.Subnet.String())
	}
	b, _ := json.Marshal(rec)
	return os.WriteFile(n.r.out, b, 0o644)
}

// WatchKernel says it is watching once the test lets it (TWILL_WATCH_GATE
// exists), as a watch does once subscribed and checked.
func (n *recorderNet) WatchKernel(ctx context.Context, _, watching func()) error {
	t := time.NewTicker(10 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		if _, err := os.Stat(os.Getenv("TWILL_WATCH_GATE")); err == nil {
			watching()
			<-ctx.Done()
			return nil
		}
	}
}

// static is a subnet manager serving fixed leases (pure logic, no etcd).
type static struct {
	conf   string
	leases []subnet.Lease
}

var _ daemon.SubnetManager = (*static)(nil)

func (s *static) NetworkConfig(context.Context) (*subnet.Config, error) {
	return subnet.ParseConfig([]byte(s.conf))
}

func (s *static) AcquireLease(_ context.Context, _ *subnet.Config, a subnet.LeaseAttrs, _ subnet.Lease) (subnet.Lease, error) {
	return subnet.Lease{Subnet: netip.MustParsePrefix("10.244.1.0/24"), Attrs: a}, nil
}

func (s *static) Run(ctx context.Context, publish func(subnet.Change)) error {
	c := subnet.Change{Full: true}
	for _, l := range s.leases {
		c.Set = append(c.Set, subnet.Entry{Key: l.Key(), Lease: l})
	}
	publish(c)
	<-ctx.Done()
	return nil
}

func TestMain(m *testing.M) {
	if os.Getenv("TWILL_DAEMON_CHILD") == "1" {
		os.Exit(runChild())
	}
	os.Exit(m.Run())
}

// runChild is the daemon side, executed by the test inside a namespace it
// made (so sysctls and iptables land there).
func runChild() int {
	h, err := nl.Open("")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	peer := func(s string) subnet.Lease {
		return subnet.Lease{Subnet: netip.MustParsePrefix(s), Attrs: subnet.LeaseAttrs{PublicIP: netip.MustParseAddr("192.168.80.9"), BackendType: "recorder"}}
	}
	sm := &static{
		conf:   `{"Network":"10.244.0.0/16","Backend":{"Type":"recorder","Greeting":"hello"}}`,
		leases: []subnet.Lease{peer("10.244.1.0/24"), peer("10.244.2.0/24"), peer("10.99.0.0/24")},
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	// The policy table's first write waits for StartedUp (so that it runs
	// at the steady GC percent): the node is never ready if StartedUp
	// waits for the policy.
	started := make(chan struct{})
	d := daemon.New(daemon.Options{
		Logger: slog.New(slog.NewTextHandler(os.Stderr, nil)), Registry: registry, Subnets: daemon.Subnets{SubnetManager: sm}, Netlink: h,
		Iface: network.IfaceOptions{Ifaces: []string{"eth0"}}, SubnetFile: os.Getenv("TWILL_SUBNET_FILE"),
		StartedUp: func() { close(started) },
		Policy: func(ctx context.Context, _ []netip.Prefix, synced func()) error {
			select {
			case <-started:
				synced()
			case <-ctx.Done():
			}
			<-ctx.Done()
			return nil
		},
	})
	go func() {
		for !d.Ready() {
			select {
			case <-ctx.Done():
				return
			case <-time.After(5 * time.Millisecond):
			}
		}
		_ = os.WriteFile(os.Getenv("TWILL_READY_FILE"), nil, 0o644)
	}()
	if err := d.Run(ctx); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

// child is a daemon run by the test in a namespace of its own, and the
// files it writes.
type child struct {
	record, env, gate, ready string
	logs                     *logtest.Buffer
	exited                   chan error
}

func startChild(t *testing.T) *child {
	ns := netnstest.New(t, "dmn")
	netnstest.Uplink(t, ns, "192.168.80.1/24")
	dir := t.TempDir()
	c := &child{
		record: filepath.Join(dir, "record.json"), env: filepath.Join(dir, "subnet.env"),
		gate: filepath.Join(dir, "watching"), ready: filepath.Join(dir, "ready"),
		logs: &logtest.Buffer{}, exited: make(chan error, 1),
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("ip", "netns", "exec", ns, self, "-test.run=^$")
	cmd.Env = append(os.Environ(), "TWILL_DAEMON_CHILD=1", "TWILL_RECORD="+c.record, "TWILL_SUBNET_FILE="+c.env, "TWILL_WATCH_GATE="+c.gate, "TWILL_READY_FILE="+c.ready)
	cmd.Stdout, cmd.Stderr = c.logs, c.logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { c.exited <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill() // by PID: the child we started
		<-c.exited
	})
	return c
}

// waitFor waits up to 20 s for ok, failing if the daemon exits first.
func (c *child) waitFor(t *testing.T, what string, ok func() bool) {
	t.Helper()
	for deadline := time.Now().Add(20 * time.Second); !ok(); time.Sleep(20 * time.Millisecond) {
		select {
		case err := <-c.exited:
			t.Fatalf("daemon exited early (%v) waiting for %s:\n%s", err, what, c.logs.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("no %s within 20s:\n%s", what, c.logs.String())
		}
	}
}

func exists(path string) func() bool {
	return func() bool { _, err := os.Stat(path); return err == nil }
}

func TestPrivilegedDaemonSelectsRegisteredBackend(t *testing.T) {
	c := startChild(t)
	var rec record
	c.waitFor(t, "reconcile by the registered backend", func() bool {
		b, err := os.ReadFile(c.record)
		return err == nil && json.Unmarshal(b, &rec) == nil
	})
	if rec.Greeting != "hello" || rec.Local != "10.244.1.0/24" {
		t.Errorf("backend got config %q and lease %q", rec.Greeting, rec.Local)
	}
	if strings.Join(rec.Peers, ",") != "10.244.2.0/24" {
		t.Errorf("backend got peers %v; want only the valid peer (own lease and the one outside Network dropped)", rec.Peers)
	}
	// subnet.env is written beside the first reconcile, once the iptables
	// rules are in place.
	var env subnet.Env
	c.waitFor(t, "subnet.env", func() bool {
		var err error
		env, err = subnet.ReadEnv(c.env)
		return err == nil
	})
	if env.Backend != "recorder" || env.MTU != 1234 || env.Subnet.String() != "10.244.1.0/24" {
		t.Errorf("subnet.env %+v", env)
	}
	if !strings.Contains(c.logs.String(), "refusing lease") || !strings.Contains(c.logs.String(), "lease=10.99.0.0/24") {
		t.Errorf("the refused lease was not logged:\n%s", c.logs.String())
	}
}

// Reconciled and set up, but its kernel watch has not made its first
// check: the node is not ready yet. It is once the watch has.
func TestPrivilegedReadyOnceTheKernelWatchChecked(t *testing.T) {
	c := startChild(t)
	c.waitFor(t, "reconcile", exists(c.record))
	c.waitFor(t, "subnet.env", exists(c.env))
	time.Sleep(500 * time.Millisecond)
	if exists(c.ready)() {
		t.Fatal("the node became ready before its kernel watch said it was watching")
	}
	if err := os.WriteFile(c.gate, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	c.waitFor(t, "readiness once the kernel watch checked", exists(c.ready))
}

// A kernel watch that never starts holds readiness back for 10 s, not for
// ever, and says so.
func TestPrivilegedReadyWithoutTheKernelWatch(t *testing.T) {
	c := startChild(t)
	c.waitFor(t, "readiness without the kernel watch", exists(c.ready))
	c.waitFor(t, "the warning that the kernel watch has not started", func() bool {
		return strings.Contains(c.logs.String(), "the kernel watch has not started; ready without it")
	})
}
