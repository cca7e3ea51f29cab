// Package kubetest runs a real kube-apiserver for tests, inside a network
// namespace the test created, on top of an etcd the test runs there too.
// The binaries come from tools/kube (built from the Go module proxy and
// cached by version under build/kube/<version>); the test process reaches
// the apiserver through a dialer that connects from inside that namespace,
// so nothing listens in, or is sent to, the machine's own namespace.
package kubetest

import (
	"bufio"
	"context"
	"crypto/rand"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	authv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/rest"

	"github.com/twill-net/twill/internal/pki"
)

// Root is the repository root (the directory holding tools/kube).
func Root(t testing.TB) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for range 10 {
		if _, err := os.Stat(filepath.Join(dir, "tools", "kube", "go.mod")); err == nil {
			return dir
		}
		dir = filepath.Dir(dir)
	}
	t.Fatal("kubetest: tools/kube/go.mod not found above the working directory")
	return ""
}

// Binaries returns the paths of kube-apiserver and kubectl, building what
// a Kubernetes lab runs (tools/kube/build.sh with KUBE_TOOLS_E2E=0, a few
// minutes once) when the cache lacks it. make setup builds it ahead of the
// tests.
func Binaries(t testing.TB) (apiserver, kubectl string) {
	t.Helper()
	dir := binDir(t, &builds.lab, "KUBE_TOOLS_E2E=0")
	return filepath.Join(dir, "kube-apiserver"), filepath.Join(dir, "kubectl")
}

// E2ESuite returns the directory of Binaries, holding Kubernetes' e2e
// suite (e2e.test) and its test images' binaries too, which it builds when
// the cache lacks them, or waits for while another build makes them (make
// test builds them beside the e2e tier).
func E2ESuite(t testing.TB) string {
	t.Helper()
	return binDir(t, &builds.suite)
}

func binDir(t testing.TB, b *toolBuild, env ...string) string {
	t.Helper()
	root := Root(t)
	b.run(t, "building the Kubernetes binaries", filepath.Join(root, "tools", "kube", "build.sh"), env...)
	ver, err := Version(root)
	if err != nil {
		t.Fatal(err)
	}
	return filepath.Join(root, "build", "kube", ver)
}

// toolBuild runs one of tools/*/build.sh once per test process: tests in
// parallel wait for the first run, and the scripts' own locks make a run
// wait for another process's build of the same part.
type toolBuild struct {
	mu   sync.Mutex
	done bool
}

func (b *toolBuild) run(t testing.TB, what, script string, env ...string) {
	t.Helper()
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.done {
		return
	}
	cmd := exec.Command("bash", script)
	cmd.Env = append(os.Environ(), env...)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%s (%s): %v\n%s", what, script, err, out)
	}
	b.done = true
}

var builds struct {
	lab, suite, crd, cnpSuite toolBuild
}

// Version is the Kubernetes version tools/kube pins.
func Version(root string) (string, error) {
	f, err := os.Open(filepath.Join(root, "tools", "kube", "go.mod"))
	if err != nil {
		return "", err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fs := strings.Fields(sc.Text())
		if len(fs) == 3 && fs[0] == "require" && fs[1] == "k8s.io/kubernetes" {
			return fs[2], nil
		}
	}
	return "", fmt.Errorf("tools/kube/go.mod: no `require k8s.io/kubernetes <version>` line")
}

// Options places the apiserver.
type Options struct {
	// NS is the network namespace to run in; Addr is an address in it that
	// the nodes reach (the underlay bridge address).
	NS   string
	Addr netip.Addr
	Port int
	// EtcdURL is an etcd reachable from NS.
	EtcdURL string
	Dir     string
}

// APIServer is a running kube-apiserver.
type APIServer struct {
	URL        string
	CAFile     string
	adminToken string
	dir        string
	kubectl    string
	ns         string
	Admin      *rest.Config
	cmd        *exec.Cmd
	done       chan struct{}
}

// Start runs kube-apiserver in o.NS and waits until it is ready. It is
// stopped (by PID) when the test ends.
func Start(t testing.TB, o Options) *APIServer {
	t.Helper()
	apiserverBin, kubectl := Binaries(t)
	if o.Port == 0 {
		o.Port = 6443
	}
	dir := o.Dir
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	s := &APIServer{URL: "https://" + net.JoinHostPort(o.Addr.String(), strconv.Itoa(o.Port)), dir: dir, kubectl: kubectl, ns: o.NS,
		adminToken: randomToken(t), done: make(chan struct{})}
	// The serving certificate and the ServiceAccount keys come from the
	// lab's PKI (internal/pki), as the Kubernetes lab's do; clients authenticate
	// with bearer tokens.
	ca, err := pki.New(filepath.Join(dir, "pki"), "twill-test-ca")
	if err != nil {
		t.Fatal(err)
	}
	tlsCrt, tlsKey, err := ca.Issue(pki.Cert{Name: "apiserver", CN: "kube-apiserver", Server: true,
		IPs: []netip.Addr{o.Addr}, DNS: []string{"kubernetes", "kubernetes.default.svc"}})
	if err != nil {
		t.Fatal(err)
	}
	saKey, saPub, err := ca.ServiceAccountKey()
	if err != nil {
		t.Fatal(err)
	}
	s.CAFile = ca.CAFile()
	tokens := filepath.Join(dir, "tokens.csv")
	if err := os.WriteFile(tokens, []byte(s.adminToken+",twill-test-admin,twill-test-admin,system:masters\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	logPath := filepath.Join(dir, "kube-apiserver.log")
	logf, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	args := []string{"netns", "exec", o.NS, apiserverBin,
		"--etcd-servers=" + o.EtcdURL,
		"--etcd-prefix=/registry-" + randomToken(t)[:8],
		"--bind-address=" + o.Addr.String(), "--advertise-address=" + o.Addr.String(),
		"--secure-port=" + strconv.Itoa(o.Port),
		"--tls-cert-file=" + tlsCrt, "--tls-private-key-file=" + tlsKey,
		"--client-ca-file=" + s.CAFile,
		"--token-auth-file=" + tokens,
		"--authorization-mode=RBAC",
		"--service-account-issuer=https://kubernetes.default.svc",
		"--service-account-key-file=" + saPub, "--service-account-signing-key-file=" + saKey,
		"--service-cluster-ip-range=10.96.0.0/24",
		"--cert-dir=" + filepath.Join(dir, "certs"),
		"--enable-priority-and-fairness=false",
		// As kubeadm sets it: a Node's InternalIP first (node proxy).
		"--kubelet-preferred-address-types=InternalIP,Hostname",
		"--v=1",
	}
	// `ip netns exec` execs in place: the PID is the apiserver's.
	cmd := exec.Command("ip", args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		logf.Close()
		t.Fatal(err)
	}
	s.cmd = cmd
	go func() { _ = cmd.Wait(); logf.Close(); close(s.done) }()
	t.Cleanup(func() { s.stop() })

	s.Admin = s.Config(s.adminToken)
	s.waitReady(t, logPath)
	return s
}

// waitReady waits (90s at most) until the apiserver's /readyz says ok.
func (s *APIServer) waitReady(t testing.TB, logPath string) {
	t.Helper()
	cli, err := corev1client.NewForConfig(s.Admin)
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(90 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		body, err := cli.RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
		cancel()
		if err == nil && strings.TrimSpace(string(body)) == "ok" {
			return
		}
		select {
		case <-s.done:
			t.Fatalf("kube-apiserver exited before it was ready; log %s:\n%s", logPath, tail(logPath))
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("kube-apiserver not ready after 90s (last: %v); log %s:\n%s", err, logPath, tail(logPath))
		}
		time.Sleep(250 * time.Millisecond)
	}
}

func (s *APIServer) stop() {
	select {
	case <-s.done:
		return
	default:
	}
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.done:
	case <-time.After(15 * time.Second):
		_ = s.cmd.Process.Kill()
		<-s.done
	}
}

// Config is a client configuration for bearer token tok; its connections
// are made from inside the apiserver's namespace.
func (s *APIServer) Config(tok string) *rest.Config {
	d := &net.Dialer{Timeout: 5 * time.Second}
	nsPath := "/var/run/netns/" + s.ns
	return &rest.Config{
		Host:            s.URL,
		BearerToken:     tok,
		TLSClientConfig: rest.TLSClientConfig{CAFile: s.CAFile},
		QPS:             1000, Burst: 2000,
		Timeout: 30 * time.Second,
		Dial: func(ctx context.Context, network, addr string) (net.Conn, error) {
			var c net.Conn
			err := ns.WithNetNSPath(nsPath, func(ns.NetNS) error {
				var err error
				c, err = d.DialContext(ctx, network, addr)
				return err
			})
			return c, err
		},
	}
}

// AdminClient is a core/v1 client with the admin (system:masters) token.
func (s *APIServer) AdminClient(t testing.TB) corev1client.CoreV1Interface {
	t.Helper()
	c, err := corev1client.NewForConfig(s.Admin)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// AdminKubeconfig writes the admin's kubeconfig (once) and returns its
// path: for kubectl, and for a test's processes that act as the cluster's
// other software would with its own RBAC (flanneld).
func (s *APIServer) AdminKubeconfig() (string, error) {
	kc := filepath.Join(s.dir, "admin.kubeconfig")
	if _, err := os.Stat(kc); err != nil {
		if err := os.WriteFile(kc, []byte(s.kubeconfig(s.adminToken)), 0o600); err != nil {
			return "", err
		}
	}
	return kc, nil
}

// Kubectl runs kubectl as admin inside the namespace and returns its
// combined output.
func (s *APIServer) Kubectl(args ...string) (string, error) {
	kc, err := s.AdminKubeconfig()
	if err != nil {
		return "", err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	full := append([]string{"netns", "exec", s.ns, s.kubectl, "--kubeconfig", kc}, args...)
	out, err := exec.CommandContext(ctx, "ip", full...).CombinedOutput()
	return string(out), err
}

// ServiceAccountKubeconfig writes a kubeconfig holding a fresh token for
// the ServiceAccount namespace/name and returns its path. The token is
// bound to that account alone: it has exactly the RBAC the cluster gives
// the account.
func (s *APIServer) ServiceAccountKubeconfig(t testing.TB, namespace, name string) string {
	t.Helper()
	return s.kubeconfigFile(t, fmt.Sprintf("%s-%s.kubeconfig", namespace, name), s.UnboundToken(t, namespace, name))
}

// UnboundToken is a fresh token for the ServiceAccount namespace/name,
// bound to no pod (so with no node claim).
func (s *APIServer) UnboundToken(t testing.TB, namespace, name string) string {
	t.Helper()
	ttl := int64(3600)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	tr, err := s.AdminClient(t).ServiceAccounts(namespace).CreateToken(ctx, name,
		&authv1.TokenRequest{Spec: authv1.TokenRequestSpec{ExpirationSeconds: &ttl}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("token for ServiceAccount %s/%s: %v", namespace, name, err)
	}
	return tr.Status.Token
}

// NodeTokenKubeconfig writes a kubeconfig holding a token for the
// ServiceAccount namespace/name bound to a pod on node, as kubelet gives
// the DaemonSet's pod on that node, and returns its path. The token carries
// the node-name claim dist/kube-twill.yml's admission policy checks. The
// pod (named <name>-<node>) is created if missing; with no kubelet it
// stays Pending, which the token does not mind. node must exist.
func (s *APIServer) NodeTokenKubeconfig(t testing.TB, namespace, name, node string) string {
	t.Helper()
	return s.kubeconfigFile(t, fmt.Sprintf("%s-%s-%s.kubeconfig", namespace, name, node), s.NodeToken(t, namespace, name, node))
}

// NodeToken is the token NodeTokenKubeconfig writes.
func (s *APIServer) NodeToken(t testing.TB, namespace, name, node string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c := s.AdminClient(t)
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name + "-" + node, Namespace: namespace},
		Spec: corev1.PodSpec{NodeName: node, ServiceAccountName: name,
			Containers: []corev1.Container{{Name: "stand-in", Image: "stand-in.invalid/none"}}}}
	p, err := c.Pods(namespace).Get(ctx, pod.Name, metav1.GetOptions{})
	if err != nil {
		if p, err = c.Pods(namespace).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
			t.Fatalf("pod %s/%s for a node-bound token: %v", namespace, pod.Name, err)
		}
	}
	ttl := int64(3600)
	tr, err := c.ServiceAccounts(namespace).CreateToken(ctx, name, &authv1.TokenRequest{Spec: authv1.TokenRequestSpec{
		ExpirationSeconds: &ttl,
		BoundObjectRef:    &authv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: p.Name, UID: p.UID},
	}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("token for ServiceAccount %s/%s bound to pod %s: %v", namespace, name, p.Name, err)
	}
	return tr.Status.Token
}

func (s *APIServer) kubeconfigFile(t testing.TB, file, tok string) string {
	t.Helper()
	path := filepath.Join(s.dir, file)
	if err := os.WriteFile(path, []byte(s.kubeconfig(tok)), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// kubeconfig is a kubeconfig for bearer token tok.
func (s *APIServer) kubeconfig(tok string) string {
	return fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: test
  cluster:
    server: %s
    certificate-authority: %s
users:
- name: test
  user:
    token: %s
contexts:
- name: test
  context: {cluster: test, user: test}
current-context: test
`, s.URL, s.CAFile, tok)
}

func tail(path string) string {
	b, _ := os.ReadFile(path)
	if len(b) > 4000 {
		b = b[len(b)-4000:]
	}
	return string(b)
}

func randomToken(t testing.TB) string {
	b := make([]byte, 16)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("%x", b)
}

// ClusterPolicyCRD fetches (or finds cached) the ClusterNetworkPolicy CRD
// tools/cnp pins, experimental channel, and returns its file.
func ClusterPolicyCRD(t testing.TB) string {
	t.Helper()
	root := Root(t)
	builds.crd.run(t, "fetching the ClusterNetworkPolicy CRD", filepath.Join(root, "tools", "cnp", "build.sh"), "CNP_SUITE=0")
	return filepath.Join(root, "build", "cnp", "current", "crd-experimental.yaml")
}

// ClusterPolicySuite builds (or finds cached, or waits for another
// process's build of) network-policy-api's conformance suite, as
// tools/cnp/build.sh builds it, and returns its test binary.
func ClusterPolicySuite(t testing.TB) string {
	t.Helper()
	root := Root(t)
	builds.cnpSuite.run(t, "building the ClusterNetworkPolicy conformance suite", filepath.Join(root, "tools", "cnp", "build.sh"))
	return filepath.Join(root, "build", "cnp", "current", "conformance-nosctp.test")
}
