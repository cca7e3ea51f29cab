package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	twcluster "github.com/twill-net/twill/lab/cluster"

	"github.com/containernetworking/plugins/pkg/ns"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/twill-net/twill/lab/cnidriver"
	"github.com/twill-net/twill/lab/topology"
	"github.com/twill-net/twill/subnet"
	"github.com/twill-net/twill/testsupport/buildtest"
	"github.com/twill-net/twill/testsupport/netnstest"
)

func TestMain(m *testing.M) {
	// make test runs this binary under the race detector, which needs cgo
	// (CGO_ENABLED=1). The go commands the tests run (the docs' go build, a
	// backend in another module) build as the binaries do, with cgo off,
	// and so share the Go build cache's compile of twill's dependencies.
	os.Setenv("CGO_ENABLED", "0")
	code := m.Run()
	buildtest.Cleanup()
	cleanupImages()
	os.Exit(code)
}

// binaries builds twilld, twillctl and the twill plugin once per test
// process.
func binaries(t testing.TB) string {
	t.Helper()
	return buildtest.Binaries(t, "github.com/twill-net/twill/cmd/twilld", "github.com/twill-net/twill/cmd/twilld-lab",
		"github.com/twill-net/twill/cmd/twillctl", "github.com/twill-net/twill/cmd/twill-lab", "github.com/twill-net/twill/cmd/twill", "github.com/twill-net/twill/cmd/twill-wg")
}

// privatePaths gives a twilld command line the state directory and
// subnet.env of its own that it lacks. No test may run twilld on the
// machine's /var/lib/twill or /run/twill: a fresh machine's make test failed
// when one did (the Kubernetes lab beside it saw the machine change), and on
// a warm machine the change hides.
func privatePaths(t testing.TB, args []string) []string {
	t.Helper()
	var dir string
	for _, flag := range []string{"--state-dir", "--subnet-file"} {
		if slices.ContainsFunc(args, func(a string) bool { return a == flag || strings.HasPrefix(a, flag+"=") }) {
			continue
		}
		if dir == "" {
			dir = t.TempDir()
		}
		path := filepath.Join(dir, "state")
		if flag == "--subnet-file" {
			path = filepath.Join(dir, "subnet.env")
		}
		args = append(args, flag, path)
	}
	return args
}

// proc is a process the test started inside a namespace; it is stopped by
// PID at cleanup.
type proc struct {
	cmd  *exec.Cmd
	Log  string
	from int64 // the log's size when the process started
	done chan struct{}
	err  error
}

func start(t testing.TB, ns, logPath string, name string, args ...string) *proc {
	t.Helper()
	return startEnv(t, nil, ns, logPath, name, args...)
}

// startEnv is start with extra environment variables for the process.
func startEnv(t testing.TB, env []string, nsName, logPath string, name string, args ...string) *proc {
	t.Helper()
	if filepath.Base(name) == "twilld" {
		args = privatePaths(t, args)
	}
	f, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	var from int64
	if fi, err := f.Stat(); err == nil {
		from = fi.Size()
	}
	cmd := exec.Command(name, args...)
	cmd.Stdout, cmd.Stderr = f, f
	if env != nil {
		cmd.Env = append(os.Environ(), env...)
	}
	// Forked from a thread inside the namespace, the process is born in
	// it, as a pod's is: nothing runs before it (`ip netns exec` is one
	// more exec and a mount namespace set up in front of it, which the
	// start-up benchmarks would count as the daemon's).
	err = ns.WithNetNSPath("/var/run/netns/"+nsName, func(ns.NetNS) error { return cmd.Start() })
	if err != nil {
		f.Close()
		t.Fatalf("starting %s in %s: %v", name, nsName, err)
	}
	p := &proc{cmd: cmd, Log: logPath, from: from, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		f.Close()
		close(p.done)
	}()
	t.Cleanup(func() { p.Stop(t) })
	return p
}

// Stop sends SIGTERM, waits up to 10s, then SIGKILLs.
func (p *proc) Stop(t testing.TB) {
	select {
	case <-p.done:
		return
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		t.Errorf("pid %d ignored SIGTERM for 10s; killing it", p.cmd.Process.Pid)
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}

// Exited reports whether the process has ended, and its error.
func (p *proc) Exited() (bool, error) {
	select {
	case <-p.done:
		return true, p.err
	default:
		return false, nil
	}
}

func (p *proc) Output() string {
	b, _ := os.ReadFile(p.Log)
	return string(b)
}

// logSince is the lines of a daemon's log stamped at since or later (a
// line without a stamp goes with the one before it), the last most of
// them.
func logSince(out string, since time.Time, most int) []string {
	var keep []string
	in := false
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		if _, rest, ok := strings.Cut(l, "time="); ok {
			stamp, _, _ := strings.Cut(rest, " ")
			if at, err := time.Parse(time.RFC3339Nano, stamp); err == nil {
				in = !at.Before(since)
			}
		}
		if in {
			keep = append(keep, l)
		}
	}
	if len(keep) > most {
		keep = append([]string{fmt.Sprintf("(%d lines before these left out)", len(keep)-most)}, keep[len(keep)-most:]...)
	}
	return keep
}

// OwnOutput is what this process logged, without what earlier processes
// (a restarted daemon's former self) left in the same log: "ready" in it
// is this process's.
func (p *proc) OwnOutput() string {
	out := p.Output()
	if int64(len(out)) < p.from {
		return ""
	}
	return out[p.from:]
}

// waitFor polls cond until it holds or timeout passes, and returns how
// long it took. It polls every 10ms for the first half second, so that the
// delays the tests log stay precise, then every 100ms: most conds exec ip
// or kubectl, and a long wait at 10ms kept most of a core busy beside the
// other tests.
func waitFor(t testing.TB, timeout time.Duration, what string, cond func() bool) time.Duration {
	t.Helper()
	timeout *= waitScale()
	start := time.Now()
	for {
		if cond() {
			return time.Since(start)
		}
		waited := time.Since(start)
		if waited > timeout {
			t.Fatalf("%s: not within %s", what, timeout)
		}
		if waited < 500*time.Millisecond {
			time.Sleep(10 * time.Millisecond)
		} else {
			time.Sleep(100 * time.Millisecond)
		}
	}
}

// WaitScaleEnv multiplies every waitFor bound: make test-kernels sets it
// in its emulated machines, where everything runs several times slower than
// on the machine itself. A measured gap is asserted unscaled.
const WaitScaleEnv = "TWILL_E2E_WAIT_SCALE"

func waitScale() time.Duration {
	if n, err := strconv.Atoi(os.Getenv(WaitScaleEnv)); err == nil && n > 1 {
		return time.Duration(n)
	}
	return 1
}

// gapBound is the longest gap a held probe may show through a hitless
// event: 1s, and in an emulated machine (WaitScaleEnv set) 3s. There a
// loaded host stalls the whole emulated CPU now and then; 3s still fails
// a first handshake WireGuard dropped, which it retries only after 5s.
func gapBound() time.Duration {
	if waitScale() > 1 {
		return 3 * time.Second
	}
	return time.Second
}

// cluster is a topology with a real etcd in its underlay and twilld in
// each node.
type cluster struct {
	t       testing.TB
	bin     string
	dir     string
	topo    *topology.Topology
	etcdURL string
	etcd    *proc
	etcdRun func() *proc // starts etcd (again) on the same data
	cli     *clientv3.Client
	daemons map[int]*proc
	daemon  string // the twilld binary the nodes run: twilld, or twilld-lab for the simulated VPC
	// daemonExtra are arguments every start of twilld gets, before its
	// own (a restart's too).
	daemonExtra []string

	notesMu sync.Mutex
	notes   []string // failures repeated after the daemons' logs (see note)
}

// note records why a test failed, to repeat it after the daemons' logs:
// CI shows only the end of the output, which the logs fill.
func (c *cluster) note(format string, args ...any) {
	c.notesMu.Lock()
	defer c.notesMu.Unlock()
	c.notes = append(c.notes, fmt.Sprintf(format, args...))
}

const netConfHostGW = `{"Network":"10.244.0.0/16","Backend":{"Type":"host-gw"}}`

func newCluster(t testing.TB, nodes int) *cluster {
	t.Helper()
	return newClusterOn(t, nodes, netip.MustParsePrefix("10.99.0.0/24"))
}

// newClusterOn is newCluster with the nodes on the given underlay.
func newClusterOn(t testing.TB, nodes int, underlay netip.Prefix) *cluster {
	t.Helper()
	return newClusterWith(t, topology.Options{Nodes: nodes, Underlay: underlay})
}

// newClusterWith builds the cluster described by o (its Prefix is chosen
// here, unique per run).
func newClusterWith(t testing.TB, o topology.Options) *cluster {
	t.Helper()
	netnstest.RequireRoot(t)
	bin := binaries(t)
	dir := t.TempDir()
	o.Prefix = fmt.Sprintf("tw%s-e%d", netnstest.RunID(), time.Now().UnixNano()%100000)
	topo, err := topology.Build(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := topo.Destroy(); err != nil {
			t.Error(err)
		}
	})
	c := &cluster{t: t, bin: bin, dir: dir, topo: topo, daemons: map[int]*proc{}, daemon: "twilld"}
	t.Cleanup(c.logDaemonsIfFailed)
	e := twcluster.NewEtcd(topo, dir, bin+"/twill-lab")
	c.etcdURL = e.URL
	c.etcdRun = func() *proc { return start(t, e.NS(), filepath.Join(dir, "etcd.log"), e.Argv()[0], e.Argv()[1:]...) }
	t.Cleanup(e.Close)
	if err := e.Start(context.Background(), func(string, string, ...string) error { c.etcd = c.etcdRun(); return nil }); err != nil {
		t.Fatal(err)
	}
	c.cli = e.Client
	return c
}

// logDaemonsIfFailed logs the end of every daemon's log when the test
// failed: a flake in CI is otherwise a bare "not within 10s".
func (c *cluster) logDaemonsIfFailed() {
	if !c.t.Failed() {
		return
	}
	for i, p := range c.daemons {
		lines := strings.Split(strings.TrimRight(p.Output(), "\n"), "\n")
		c.t.Logf("node%d's %s, last %d lines of its log:\n%s", i+1, c.daemon, min(len(lines), 40), strings.Join(lines[max(0, len(lines)-40):], "\n"))
	}
	c.notesMu.Lock()
	defer c.notesMu.Unlock()
	for _, n := range c.notes {
		c.t.Logf("failed: %s", n)
	}
}

func (c *cluster) put(key, value string) {
	c.t.Helper()
	if _, err := c.cli.Put(context.Background(), key, value); err != nil {
		c.t.Fatal(err)
	}
}

func (c *cluster) del(key string) {
	c.t.Helper()
	if _, err := c.cli.Delete(context.Background(), key); err != nil {
		c.t.Fatal(err)
	}
}

func (c *cluster) subnetFile(i int) string {
	return twcluster.SubnetFile(twcluster.NodeDir(c.dir, c.topo.Nodes[i].Name))
}

// startDaemon runs the built twilld in node i (0-based).
func (c *cluster) startDaemon(i int, extra ...string) *proc {
	c.t.Helper()
	n := c.topo.Nodes[i]
	state := twcluster.NodeDir(c.dir, n.Name)
	if err := os.MkdirAll(state, 0o755); err != nil {
		c.t.Fatal(err)
	}
	p := start(c.t, n.NS, filepath.Join(c.dir, n.Name+".log"), c.bin+"/"+c.daemon, twcluster.DaemonArgs(c.etcdURL, state, slices.Concat(c.daemonExtra, extra)...)...)
	c.daemons[i] = p
	return p
}

// env waits for node i's subnet.env and returns it.
func (c *cluster) env(i int) subnet.Env {
	c.t.Helper()
	var env subnet.Env
	waitFor(c.t, 10*time.Second, fmt.Sprintf("node%d subnet.env", i+1), func() bool {
		var err error
		env, err = subnet.ReadEnv(c.subnetFile(i))
		return err == nil
	})
	return env
}

func (c *cluster) routes(i int) string {
	out, err := exec.Command("ip", "-n", c.topo.Nodes[i].NS, "-4", "route", "show").CombinedOutput()
	if err != nil {
		c.t.Fatalf("ip route in node%d: %v: %s", i+1, err, out)
	}
	return string(out)
}

// routeLine is how `ip route` prints the host-gw route on a node to node j.
func (c *cluster) hostgwRoute(j int, s netip.Prefix) string {
	return fmt.Sprintf("%s via %s dev eth0 proto 167", s, c.topo.Nodes[j].Addr.Addr())
}

// nodeGet fetches http://127.0.0.1:<port><path> from inside a namespace
// and returns the status code and body.
func nodeGet(t testing.TB, nsName string, port int, path string) (int, string) {
	t.Helper()
	resp, err := nodeClient(nsName).Get(fmt.Sprintf("http://127.0.0.1:%d%s", port, path))
	if err != nil {
		t.Fatalf("GET %s in %s: %v", path, nsName, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

// nodeClient is an HTTP client whose connections are made from inside
// the network namespace nsName.
func nodeClient(nsName string) *http.Client {
	nsPath := "/var/run/netns/" + nsName
	return &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, network, addr string) (c net.Conn, err error) {
			err = ns.WithNetNSPath(nsPath, func(ns.NetNS) error {
				c, err = (&net.Dialer{}).DialContext(ctx, network, addr)
				return err
			})
			return c, err
		}}}
}

// metricIn reads one unlabelled metric from a daemon's /metrics.
func metricIn(t testing.TB, nsName string, port int, name string) string {
	t.Helper()
	_, body := nodeGet(t, nsName, port, "/metrics")
	for _, line := range strings.Split(body, "\n") {
		if f := strings.Fields(line); len(f) == 2 && f[0] == name {
			return f[1]
		}
	}
	t.Fatalf("no metric %s in %s", name, nsName)
	return ""
}

func ping(ns string, dst netip.Addr) error {
	out, err := exec.Command("ip", "netns", "exec", ns, "ping", "-c", "2", "-i", "0.2", "-W", "2", dst.String()).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ping %s from %s: %w: %s", dst, ns, err, out)
	}
	return nil
}

func errorsIsExit(err error) bool {
	var ee *exec.ExitError
	return errors.As(err, &ee)
}

func contains(s string, subs ...string) bool {
	for _, x := range subs {
		if !strings.Contains(s, x) {
			return false
		}
	}
	return true
}

// addPod creates a pod namespace behind node i and wires it with the twill
// CNI plugin through libcni (run inside the node's namespace).
func (c *cluster) addPod(i int, name string) (string, netip.Addr) {
	c.t.Helper()
	ns, v4, v6 := c.addPodIPs(i, name)
	if v4.IsValid() {
		return ns, v4
	}
	return ns, v6
}

// cni runs one CNI operation (add, check, del) for pod name on node i
// through libcni, inside the node's namespace, and returns its outcome.
func (c *cluster) cni(i int, op, name, podNS string) cnidriver.Outcome {
	c.t.Helper()
	state := filepath.Join(c.dir, c.topo.Nodes[i].Name)
	list := fmt.Sprintf(`{"cniVersion":"1.1.0","name":"pods","plugins":[{"type":"twill","subnetFile":%q,"dataDir":%q}]}`,
		c.subnetFile(i), filepath.Join(state, "networks"))
	req := cnidriver.Request{Op: op, ConfList: json.RawMessage(list), BinDirs: []string{c.bin}, CacheDir: filepath.Join(state, "cni-cache"),
		Attachments: []cnidriver.Attachment{{ContainerID: name, IfName: "eth0", Netns: "/var/run/netns/" + podNS}}}
	resp, err := cnidriver.RunIn(context.Background(), c.bin+"/twill-lab", c.topo.Nodes[i].NS, req)
	if err != nil || len(resp.Outcomes) != 1 {
		c.t.Fatalf("cni %s %s on node%d: %+v (%v)", op, name, i+1, resp, err)
	}
	return resp.Outcomes[0]
}

// udp sends datagrams of 1,400 bytes from a pod to an echo in another
// and fails unless most come back intact: with vxlan, the inner UDP
// checksum is the one the checksum workaround (TXChecksumOffload) is about.
func (c *cluster) udp(serverNS string, server netip.Addr, clientNS string) {
	c.t.Helper()
	var srv *net.UDPConn
	err := ns.WithNetNSPath("/var/run/netns/"+serverNS, func(ns.NetNS) error {
		var err error
		srv, err = net.ListenUDP("udp", net.UDPAddrFromAddrPort(netip.AddrPortFrom(server, 0)))
		return err
	})
	if err != nil {
		c.t.Fatalf("UDP echo in %s: %v", serverNS, err)
	}
	defer srv.Close()
	go func() {
		buf := make([]byte, 2048)
		for {
			n, from, err := srv.ReadFromUDPAddrPort(buf)
			if err != nil {
				return
			}
			_, _ = srv.WriteToUDPAddrPort(buf[:n], from)
		}
	}()
	var cl *net.UDPConn
	err = ns.WithNetNSPath("/var/run/netns/"+clientNS, func(ns.NetNS) error {
		var err error
		cl, err = net.DialUDP("udp", nil, srv.LocalAddr().(*net.UDPAddr))
		return err
	})
	if err != nil {
		c.t.Fatalf("UDP from %s: %v", clientNS, err)
	}
	defer cl.Close()
	const sent = 20
	back := 0
	payload := bytes.Repeat([]byte("twill-udp-"), 140)
	buf := make([]byte, 2048)
	for i := range sent {
		payload[0] = byte(i)
		if _, err := cl.Write(payload); err != nil {
			c.t.Fatalf("UDP to %s: %v", server, err)
		}
		_ = cl.SetReadDeadline(time.Now().Add(time.Second))
		if n, err := cl.Read(buf); err == nil && bytes.Equal(buf[:n], payload) {
			back++
		}
	}
	if back < sent/2 {
		c.t.Fatalf("UDP from %s to %s: %d of %d datagrams of %d bytes came back intact", clientNS, server, back, sent, len(payload))
	}
}

// tcp runs an iperf3 exchange from client to server's address: a real TCP
// connection carrying data, not just an echo.
func (c *cluster) tcp(serverNS string, server netip.Addr, clientNS string, extra ...string) string {
	c.t.Helper()
	p := start(c.t, serverNS, filepath.Join(c.dir, "iperf-"+serverNS+".log"), "iperf3", "-s", "-1", "-p", "5201")
	defer p.Stop(c.t)
	var out []byte
	var err error
	for range 50 { // the server needs a moment to listen
		args := append([]string{"netns", "exec", clientNS, "iperf3", "-c", server.String(), "-p", "5201", "-n", "1M", "--connect-timeout", "1000"}, extra...)
		out, err = exec.Command("ip", args...).CombinedOutput()
		if err == nil {
			return string(out)
		}
		time.Sleep(100 * time.Millisecond)
	}
	c.t.Fatalf("TCP from %s to %s: %v\n%s", clientNS, server, err, out)
	return ""
}
