package daemon_test

import (
	"context"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twill-net/twill/backend/hostgw"
	"github.com/twill-net/twill/daemon"
	"github.com/twill-net/twill/nl"
	"github.com/twill-net/twill/subnet"
)

// freeLoopback is a loopback address with a port nothing listens on.
func freeLoopback(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

// The health endpoints say what an operator's probe asks: /readyz fails
// until the node is set up, /healthz while the loop runs, /metrics counts
// the leases, and nothing but GET is served.
func TestEngineHealthEndpoints(t *testing.T) {
	addr := freeLoopback(t)
	peer2 := peerLease("10.244.2.0/24", "192.168.1.2")
	peer2.Attrs.BackendType = hostgw.Type
	mon := &monitored{}
	e := startEngineWith(t, hostgw.Type, nil, 0, func(e *engine, o *daemon.Options) {
		o.HealthAddr = addr
		mon.memSubnets = e.subnets
		o.Subnets = daemon.Subnets{SubnetManager: mon, Monitor: mon, Conflicts: mon, DataUpdater: mon}
	}, peer2)
	client := &http.Client{Timeout: 5 * time.Second}
	call := func(method, path string) (int, string) {
		req, err := http.NewRequestWithContext(context.Background(), method, "http://"+addr+path, nil)
		if err != nil {
			t.Fatal(err)
		}
		resp, err := client.Do(req)
		if err != nil {
			return 0, err.Error()
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body)
	}
	e.waitFor("the health server", func() bool { code, _ := call("GET", "/healthz"); return code != 0 })
	if code, body := call("GET", "/readyz"); code != http.StatusServiceUnavailable || !strings.Contains(body, "not ready") {
		t.Errorf("/readyz before the node's setup: %d %q, want 503 not ready", code, body)
	}
	if code, body := call("GET", "/healthz"); code != http.StatusOK {
		t.Errorf("/healthz: %d %q, want 200", code, body)
	}
	e.node.open()
	e.waitFor("ready", e.d.Ready)
	if code, body := call("GET", "/readyz"); code != http.StatusOK {
		t.Errorf("/readyz once ready: %d %q, want 200", code, body)
	}
	code, body := call("GET", "/metrics")
	for _, want := range []string{"\ntwill_leases 1\n", "\ntwill_subnet_manager_connected 1\n", "\ntwill_lease_conflicts_total 2\n"} {
		if code != http.StatusOK || !strings.Contains(body, want) {
			t.Errorf("/metrics: %d, want 200 and %q:\n%s", code, want, body)
		}
	}
	// The datastore goes out of reach: the node is no longer ready.
	mon.down.Store(true)
	if code, body := call("GET", "/readyz"); code != http.StatusServiceUnavailable || !strings.Contains(body, "etcd unreachable") {
		t.Errorf("/readyz with the datastore out of reach: %d %q, want 503 naming why", code, body)
	}
	if _, body := call("GET", "/metrics"); !strings.Contains(body, "\ntwill_subnet_manager_connected 0\n") {
		t.Errorf("/metrics with the datastore out of reach: want twill_subnet_manager_connected 0:\n%s", body)
	}
	for _, path := range []string{"/readyz", "/healthz", "/metrics"} {
		if code, _ := call("POST", path); code != http.StatusMethodNotAllowed {
			t.Errorf("POST %s: %d, want 405", path, code)
		}
	}
}

// Addresses of pods that are gone (no host veth) are released by the
// daemon's check; a live pod's address stays.
func TestEngineReclaimsAddresses(t *testing.T) {
	store := filepath.Join(t.TempDir(), "twill")
	if err := os.MkdirAll(store, 0o755); err != nil {
		t.Fatal(err)
	}
	old := time.Now().Add(-time.Minute)
	for ip, id := range map[string]string{"10.244.1.5": "gone", "10.244.1.6": "alive"} {
		p := filepath.Join(store, ip)
		if err := os.WriteFile(p, []byte(id+"\r\neth0"), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Chtimes(p, old, old); err != nil {
			t.Fatal(err)
		}
	}
	e := startEngineWith(t, hostgw.Type, nil, 0, func(e *engine, o *daemon.Options) {
		o.Allocations = daemon.AllocationsOptions{Dir: store, Every: 10 * time.Millisecond}
		e.k.AddLink(nl.PodLinkName("alive", "eth0"), 1500, true)
	}, []subnet.Lease{}...)
	e.node.open()
	e.waitFor("the gone pod's address released", func() bool { return !fileExists(filepath.Join(store, "10.244.1.5")) })
	if !fileExists(filepath.Join(store, "10.244.1.6")) {
		t.Error("the live pod's address was released")
	}
	e.waitFor("the release logged", func() bool {
		return strings.Contains(e.log.String(), "released addresses whose pods are gone")
	})
}

// monitored is memSubnets with a datastore that can go out of reach, and
// two overwrites of the node's own lease seen.
type monitored struct {
	*memSubnets
	down atomic.Bool
}

func (m *monitored) Monitor(ctx context.Context) error { <-ctx.Done(); return nil }

func (m *monitored) Connected() (bool, string) {
	if m.down.Load() {
		return false, "etcd unreachable (the test's)"
	}
	return true, ""
}

func (m *monitored) OwnLeaseConflicts() uint64 { return 2 }
