package e2e

import (
	"fmt"
	"io/fs"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"

	twcluster "github.com/twill-net/twill/lab/cluster"
)

// TestFilesAndPorts: what twilld and the plugin leave on a node's disk
// has the modes Documentation/configuration.md gives (the state directory
// 0700 even when made looser beforehand, the VTEP MAC and the pods'
// address records 0600, subnet.env 0644 and written whole), /healthz,
// /readyz and /metrics listen on --healthz-ip alone, and answer nothing but
// GET.
func TestFilesAndPorts(t *testing.T) {
	beside(t)
	c := newCluster(t, 1)
	c.put("/twill.io/network/config", netConfVXLAN)
	state := twcluster.NodeDir(c.dir, c.topo.Nodes[0].Name)
	if err := os.MkdirAll(state, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(state, 0o755); err != nil { // as a hostPath DirectoryOrCreate makes it
		t.Fatal(err)
	}
	conf := filepath.Join(c.dir, "cni-conf.json")
	confDest := filepath.Join(c.dir, "net.d", "10-twill.conflist")
	if err := os.WriteFile(conf, fmt.Appendf(nil, `{"cniVersion":"1.0.0","name":"pods","plugins":[{"type":"twill","subnetFile":%q,"dataDir":%q}]}`,
		c.subnetFile(0), filepath.Join(state, "networks")), 0o644); err != nil {
		t.Fatal(err)
	}
	c.startDaemon(0, "--healthz-ip", "127.0.0.1", "--healthz-port", fmt.Sprint(healthPort),
		"--cni-conflist", conf, "--cni-conflist-dest", confDest)
	c.env(0)
	nsName := c.topo.Nodes[0].NS
	_, _ = c.addPod(0, "files")

	mode := func(path string) fs.FileMode {
		t.Helper()
		fi, err := os.Stat(path)
		if err != nil {
			t.Fatal(err)
		}
		return fi.Mode().Perm()
	}
	if m := mode(state); m != 0o700 {
		t.Errorf("state directory %s: mode %o, want 700", state, m)
	}
	macs, _ := filepath.Glob(filepath.Join(state, "vxlan-*.mac"))
	if len(macs) != 1 {
		t.Fatalf("VTEP MAC files in %s: %v, want one", state, macs)
	}
	if m := mode(macs[0]); m != 0o600 {
		t.Errorf("%s: mode %o, want 600", macs[0], m)
	}
	if m := mode(c.subnetFile(0)); m != 0o644 {
		t.Errorf("subnet.env: mode %o, want 644", m)
	}
	waitFor(t, 10*time.Second, "the conflist installed", func() bool { _, err := os.Stat(confDest); return err == nil })
	if m := mode(confDest); m != 0o644 {
		t.Errorf("the installed conflist: mode %o, want 644", m)
	}
	records, _ := filepath.Glob(filepath.Join(state, "networks", "pods", "10.*"))
	if len(records) != 1 {
		t.Fatalf("address records: %v, want one", records)
	}
	if m := mode(records[0]); m != 0o600 {
		t.Errorf("address record %s: mode %o, want 600", records[0], m)
	}
	// subnet.env and the conflist are written whole (to a temporary file
	// renamed over them): no temporary file is left beside them.
	for _, dir := range []string{filepath.Dir(c.subnetFile(0)), filepath.Dir(confDest)} {
		if left, _ := filepath.Glob(filepath.Join(dir, ".*.tmp*")); len(left) != 0 {
			t.Errorf("temporary files left: %v", left)
		}
	}

	// Served on 127.0.0.1 alone: the node's own address is refused.
	nodeAddr := c.topo.Nodes[0].Addr.Addr()
	err := ns.WithNetNSPath("/var/run/netns/"+nsName, func(ns.NetNS) error {
		conn, err := net.DialTimeout("tcp", net.JoinHostPort(nodeAddr.String(), fmt.Sprint(healthPort)), 2*time.Second)
		if err == nil {
			conn.Close()
		}
		return err
	})
	if err == nil {
		t.Errorf("/metrics answers on %s:%d; --healthz-ip 127.0.0.1 should bind loopback alone", nodeAddr, healthPort)
	}
	// Read-only: GET answers, every other method gets 405.
	if code, _ := nodeGet(t, nsName, healthPort, "/readyz"); code != http.StatusOK {
		t.Errorf("GET /readyz: %d", code)
	}
	for _, path := range []string{"/healthz", "/readyz", "/metrics"} {
		for _, method := range []string{http.MethodPost, http.MethodPut, http.MethodDelete, http.MethodPatch} {
			if code := nodeDo(t, nsName, method, healthPort, path); code != http.StatusMethodNotAllowed {
				t.Errorf("%s %s: %d, want 405", method, path, code)
			}
		}
	}
}

// nodeDo sends an empty request with method to path on 127.0.0.1:port
// inside nsName and returns the status code.
func nodeDo(t testing.TB, nsName, method string, port int, path string) int {
	t.Helper()
	req, err := http.NewRequest(method, fmt.Sprintf("http://127.0.0.1:%d%s", port, path), strings.NewReader("x"))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := nodeClient(nsName).Do(req)
	if err != nil {
		t.Fatalf("%s %s in %s: %v", method, path, nsName, err)
	}
	resp.Body.Close()
	return resp.StatusCode
}
