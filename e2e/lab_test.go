package e2e

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/twill-net/twill/lab"
	"github.com/twill-net/twill/testsupport/kubetest"
	"github.com/twill-net/twill/testsupport/netnstest"
)

// labCtl runs the built twillctl lab with a per-test state root.
type labCtl struct {
	t    testing.TB
	bin  string
	root string
}

func newLabCtl(t testing.TB) *labCtl {
	netnstest.RequireRoot(t)
	return &labCtl{t: t, bin: binaries(t), root: t.TempDir()}
}

func (l *labCtl) run(args ...string) (string, error) {
	// --state-root right after the subcommand: anything after "--" belongs
	// to the command lab exec runs.
	full := append([]string{"lab", args[0], "--state-root", l.root}, args[1:]...)
	out, err := exec.Command(l.bin+"/twillctl", full...).CombinedOutput()
	return string(out), err
}

// name is unique per run, so labs of concurrent runs never collide.
func labName(n string) string { return n + netnstest.RunID()[:4] }

// up starts a lab and registers its removal.
func (l *labCtl) up(name string, args ...string) {
	l.t.Helper()
	l.t.Cleanup(func() { _, _ = l.run("down", "--name", name) })
	start := time.Now()
	if out, err := l.run(append([]string{"up", "--name", name}, args...)...); err != nil {
		l.t.Fatalf("lab up %v: %v\n%s", args, err, out)
	}
	l.t.Logf("lab up --name %s %v took %s", name, args, time.Since(start).Round(10*time.Millisecond))
}

func (l *labCtl) check(name string, pods int) {
	l.t.Helper()
	out, err := l.run("check", "--name", name)
	if err != nil || !strings.Contains(out, fmt.Sprintf("%d of %d pairs OK", pods*pods, pods*pods)) {
		l.t.Fatalf("lab check %s: %v\n%s", name, err, out)
	}
}

// checkAll runs lab check and requires every pair it probed to connect.
func (l *labCtl) checkAll(name string) {
	l.t.Helper()
	out, err := l.run("check", "--name", name)
	var ok, all int
	for _, line := range strings.Split(out, "\n") {
		if _, serr := fmt.Sscanf(line, "%d of %d pairs OK", &ok, &all); serr == nil {
			break
		}
	}
	if err != nil || all == 0 || ok != all {
		l.t.Fatalf("lab check %s: %v\n%s", name, err, out)
	}
	l.t.Logf("lab check %s: %d of %d pairs OK", name, ok, all)
}

// requireGone checks nothing of the lab is left: no namespace (nor its
// mount), no process, no state.
func (l *labCtl) requireGone(name string) {
	l.t.Helper()
	out, _ := exec.Command("ip", "netns", "list").CombinedOutput()
	if strings.Contains(string(out), "twl-"+name+"-") {
		l.t.Errorf("namespaces left:\n%s", out)
	}
	mounts, _ := os.ReadFile("/proc/self/mountinfo")
	if strings.Contains(string(mounts), "twl-"+name+"-") {
		l.t.Errorf("netns mounts left")
	}
	if _, err := os.Stat(filepath.Join(l.root, name)); !os.IsNotExist(err) {
		l.t.Errorf("state directory left (%v)", err)
	}
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		cmdline, err := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		if err == nil && strings.Contains(string(cmdline), filepath.Join(l.root, name)) {
			l.t.Errorf("process %s of the lab still runs: %q", e.Name(), strings.ReplaceAll(string(cmdline), "\x00", " "))
		}
	}
	// A Kubernetes lab's pods live in cgroups of the lab's; a cgroup can only
	// go once no process is left in it.
	if cg, _ := filepath.Glob("/sys/fs/cgroup/*/twl-" + name + "-*"); len(cg) > 0 {
		l.t.Errorf("cgroups left: %v", cg)
	}
}

func TestLabDefaultAndSideBySide(t *testing.T) {
	beside(t)
	l := newLabCtl(t)
	a, b := labName("a"), labName("b")
	l.up(a, "--nodes", "3", "--pods-per-node", "2", "--backend", "vxlan")
	l.up(b, "--nodes", "3", "--pods-per-node", "2", "--backend", "host-gw", "--underlay", "flat")
	l.check(a, 6)
	l.check(b, 6)
	for _, n := range []string{a, b} {
		if out, err := l.run("down", "--name", n); err != nil {
			t.Fatalf("lab down: %v\n%s", err, out)
		}
		l.requireGone(n)
	}
}

// TestLabNetfilter: `twillctl lab up --netfilter nftables` (and iptables)
// passes lab check, and each node holds that mode's rules alone.
func TestLabNetfilter(t *testing.T) {
	beside(t)
	for _, mode := range []string{"nftables", "iptables"} {
		t.Run(mode, func(t *testing.T) {
			l := newLabCtl(t)
			n := labName("f" + mode[:1])
			l.up(n, "--nodes", "2", "--pods-per-node", "2", "--backend", "vxlan", "--netfilter", mode)
			l.check(n, 4)
			out, err := l.run("status", "--name", n)
			if err != nil || !strings.Contains(out, "netfilter "+mode) {
				t.Errorf("lab status: %v\n%s", err, out)
			}
			nft, _ := l.run("exec", "--name", n, "node1", "--", "nft", "list", "table", "inet", "twill")
			ipt, _ := l.run("exec", "--name", n, "node1", "--", "iptables-save")
			hasNFT, hasIPT := strings.Contains(nft, "masquerade fully-random"), strings.Contains(ipt, "-A TWILL-POSTRTG")
			if hasNFT != (mode == "nftables") || hasIPT != (mode == "iptables") {
				t.Errorf("node1 in the %s mode: nftables\n%s\niptables\n%s", mode, nft, ipt)
			}
		})
	}
}

func TestLabRoutedVXLAN(t *testing.T) {
	beside(t)
	l := newLabCtl(t)
	n := labName("r")
	l.up(n, "--nodes", "4", "--pods-per-node", "2", "--backend", "vxlan", "--underlay", "routed")
	l.check(n, 8)
}

// TestLabIPFamilies: an IPv6-only lab on a routed IPv6 underlay (vxlan)
// and dual-stack labs (host-gw; wireguard, one device per family) pass
// lab check, and so do wireguard labs of one family (IPv4 across a router,
// IPv6-only), which probes every
// address of every pod; a dual-stack pod is probed at both.
func TestLabIPFamilies(t *testing.T) {
	beside(t)
	for _, tc := range []struct {
		family, backend, underlay string
		targets                   int
	}{
		{"ipv6", "vxlan", "routed", 4},
		{"dual", "host-gw", "flat", 8},
		{"dual", "wireguard", "flat", 8},
		{"ipv4", "wireguard", "routed", 4},
		{"ipv6", "wireguard", "flat", 4},
	} {
		t.Run(tc.family+"-"+tc.backend, func(t *testing.T) {
			l := newLabCtl(t)
			n := labName("i" + tc.family[3:] + tc.backend[:1])
			l.up(n, "--nodes", "2", "--pods-per-node", "2", "--backend", tc.backend, "--underlay", tc.underlay, "--ip-family", tc.family)
			out, err := l.run("check", "--name", n)
			if want := fmt.Sprintf("%d of %d pairs OK", 4*tc.targets, 4*tc.targets); err != nil || !strings.Contains(out, want) {
				t.Fatalf("lab check: %v, want %q\n%s", err, want, out)
			}
			st, err := l.run("status", "--name", n)
			if tc.family == "ipv4" {
				return
			}
			if err != nil || !strings.Contains(st, "fd00:10:") {
				t.Errorf("lab status shows no IPv6 pod subnet or address: %v\n%s", err, st)
			}
		})
	}
}

// TestLabENI: `twillctl lab up --backend eni` on its simulated VPC, in both
// modes, and `lab check` passes.
func TestLabENI(t *testing.T) {
	beside(t)
	for _, mode := range []string{"prefix", "secondary-ip"} {
		t.Run(mode, func(t *testing.T) {
			l := newLabCtl(t)
			n := labName("e" + mode[:1])
			l.up(n, "--nodes", "3", "--pods-per-node", "2", "--backend", "eni", "--eni-mode", mode)
			l.check(n, 6)
		})
	}
}

func TestLabTenNodes(t *testing.T) {
	beside(t)
	l := newLabCtl(t)
	n := labName("ten")
	l.up(n, "--nodes", "10", "--pods-per-node", "3")
	l.check(n, 30)
}

func TestLabRefusesHostGWAcrossRouter(t *testing.T) {
	beside(t)
	l := newLabCtl(t)
	n := labName("bad")
	out, err := l.run("up", "--name", n, "--backend", "host-gw", "--underlay", "routed")
	if err == nil || !strings.Contains(out, "same L2 segment") {
		t.Fatalf("want a refusal explaining host-gw needs one L2 segment; got %v\n%s", err, out)
	}
	l.requireGone(n)
}

func TestLabDownAfterKilledUp(t *testing.T) {
	beside(t)
	l := newLabCtl(t)
	n := labName("kill")
	for _, after := range []time.Duration{300 * time.Millisecond, 900 * time.Millisecond} {
		cmd := exec.Command(l.bin+"/twillctl", "lab", "up", "--name", n, "--state-root", l.root)
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		time.Sleep(after)
		_ = cmd.Process.Signal(syscall.SIGKILL)
		_ = cmd.Wait()
		if out, err := l.run("down", "--name", n); err != nil {
			t.Fatalf("lab down after SIGKILL at %s: %v\n%s", after, err, out)
		}
		l.requireGone(n)
	}
}

// TestLabStatusReportsDrift: with the node's daemon paused, a twill route
// deleted by hand shows as missing in twillctl status; once the daemon runs
// again it repairs it and status is clean.
func TestLabStatusReportsDrift(t *testing.T) {
	beside(t)
	l := newLabCtl(t)
	n := labName("st")
	l.up(n, "--nodes", "3", "--pods-per-node", "1")
	stateDir := filepath.Join(l.root, n)
	st, err := lab.Load(l.root, n)
	if err != nil {
		t.Fatal(err)
	}
	pid := 0
	for _, p := range st.Processes {
		if p.Role == "twilld" && strings.HasSuffix(p.NS, "-n1") {
			pid = p.PID
		}
	}
	if pid == 0 {
		t.Fatalf("no twilld for node1 in %+v", st.Processes)
	}
	status := func() (string, error) {
		return l.run("exec", "--name", n, "node1", "--", l.bin+"/twillctl", "status", "--etcd-endpoints", "http://10.99.0.254:2379",
			"--subnet-file", filepath.Join(stateDir, "node1", "subnet.env"), "--state-dir", filepath.Join(stateDir, "node1"), "--iface", "eth0")
	}
	if out, err := status(); err != nil || !strings.Contains(out, "in sync") {
		t.Fatalf("status before: %v\n%s", err, out)
	}
	ns := "twl-" + n + "-n1"
	routes, _ := exec.Command("ip", "-n", ns, "route", "show", "proto", "167").CombinedOutput()
	victim := strings.Fields(string(routes))[0]
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	defer syscall.Kill(pid, syscall.SIGCONT)
	if out, err := exec.Command("ip", "-n", ns, "route", "del", victim).CombinedOutput(); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	out, err := status()
	if err == nil || !strings.Contains(out, "missing  route "+victim) {
		t.Fatalf("status with the route deleted: %v\n%s", err, out)
	}
	if err := syscall.Kill(pid, syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, "status clean again", func() bool {
		out, err := status()
		return err == nil && strings.Contains(out, "in sync")
	})
}

// TestLabExampleBackend builds the custom twilld and twillctl of
// Documentation/examples (the built-in backends plus directgw, registered
// from its package's init()) and runs a lab on them, as
// writing-a-backend.md shows; the custom twillctl's status checks directgw.
func TestLabExampleBackend(t *testing.T) {
	beside(t)
	l := newLabCtl(t)
	dir := t.TempDir()
	if out, err := exec.Command("cp", filepath.Join(l.bin, "twill"), filepath.Join(l.bin, "twill-lab"), dir).CombinedOutput(); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	for bin, pkg := range map[string]string{"twilld": "twilld-directgw", "twillctl": "twillctl-directgw"} {
		build := exec.Command("go", "build", "-o", filepath.Join(dir, bin), "../Documentation/examples/"+pkg)
		if out, err := build.CombinedOutput(); err != nil {
			t.Fatalf("building the custom %s: %v: %s", bin, err, out)
		}
	}
	l.bin = dir
	n := labName("ex")
	l.up(n, "--nodes", "3", "--pods-per-node", "1", "--backend", "directgw")
	l.check(n, 3)
	out, err := exec.Command("ip", "-n", "twl-"+n+"-n1", "route", "show", "proto", "167").CombinedOutput()
	if err != nil || strings.Count(string(out), "via 10.99.0.") != 2 {
		t.Fatalf("want two directgw routes on node1: %v\n%s", err, out)
	}
	if out, err := l.run("exec", "--name", n, "node1", "--", "twillctl", "status"); err != nil || !strings.Contains(out, "backend directgw") ||
		!strings.Contains(out, "in sync") {
		t.Fatalf("the custom twillctl's status on a directgw node: %v\n%s", err, out)
	}
}

// TestBackendInAnotherModule: the example backend, built from a module of
// its own with the replace writing-a-backend.md shows, and its unit test
// run there: a third party's backend tested on the public fake kernel
// (nl/nlfake) and test helpers (backend/backendtest); the custom twilld
// built on cmd/twilld/app and the program that embeds the public engine
// (package daemon, Documentation/examples/engine) both build there and list
// the backend.
func TestBackendInAnotherModule(t *testing.T) {
	beside(t)
	root := kubetest.Root(t)
	mod := t.TempDir()
	src, err := os.ReadFile(filepath.Join(root, "Documentation", "examples", "directgw", "directgw.go"))
	if err != nil {
		t.Fatal(err)
	}
	test, err := os.ReadFile(filepath.Join(root, "Documentation", "examples", "directgw", "directgw_test.go"))
	if err != nil {
		t.Fatal(err)
	}
	main, err := os.ReadFile(filepath.Join(root, "Documentation", "examples", "twilld-directgw", "main.go"))
	if err != nil {
		t.Fatal(err)
	}
	engine, err := os.ReadFile(filepath.Join(root, "Documentation", "examples", "engine", "main.go"))
	if err != nil {
		t.Fatal(err)
	}
	files := map[string][]byte{"directgw/directgw.go": src, "directgw/directgw_test.go": test, "cmd/twilld/main.go": main, "cmd/engine/main.go": engine}
	for path, data := range files {
		// What a third party writes needs no internal package (Go would
		// refuse it) and no type assertion on twill's types.
		if bytes.Contains(data, []byte("twill/internal/")) || bytes.Contains(data, []byte(".(")) {
			t.Errorf("%s: an internal/ import or a type assertion: the public engine and contract should be enough", path)
		}
		files[path] = bytes.Replace(data, []byte("github.com/twill-net/twill/Documentation/examples/directgw"), []byte("example.com/mybackend/directgw"), 1)
	}
	files["go.mod"] = []byte("module example.com/mybackend\n\ngo 1.26\n\nrequire github.com/twill-net/twill v0.0.0\n\nreplace github.com/twill-net/twill => " + root + "\n")
	for path, data := range files {
		if err := os.MkdirAll(filepath.Dir(filepath.Join(mod, path)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(mod, path), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for _, args := range [][]string{{"mod", "tidy"}, {"build", "-o", filepath.Join(mod, "twilld"), "./cmd/twilld"},
		{"build", "-o", filepath.Join(mod, "engine"), "./cmd/engine"}, {"test", "-count=1", "-v", "./directgw/"}} {
		cmd := exec.Command("go", args...)
		cmd.Dir = mod
		cmd.Env = append(os.Environ(), "GOFLAGS=-mod=mod -trimpath")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("go %s in a module of its own: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	for _, bin := range []string{"twilld", "engine"} {
		out, err := exec.Command(filepath.Join(mod, bin), "--help").CombinedOutput()
		if !strings.Contains(string(out), "directgw") {
			t.Fatalf("the custom %s does not list directgw: %v\n%s", bin, err, out)
		}
	}
}

// TestLabDownStopsOrphanedDaemon: a node namespace deleted by hand while
// its twilld runs leaves the daemon in an unnamed namespace; lab down
// still stops it (identified by PID and its command line), and nothing of
// the lab remains.
func TestLabDownStopsOrphanedDaemon(t *testing.T) {
	beside(t)
	l := newLabCtl(t)
	n := labName("orph")
	l.up(n, "--nodes", "2", "--pods-per-node", "0")
	if out, err := exec.Command("ip", "netns", "del", "twl-"+n+"-n2").CombinedOutput(); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if out, err := l.run("down", "--name", n); err != nil {
		t.Fatalf("lab down: %v\n%s", err, out)
	}
	l.requireGone(n)
}
