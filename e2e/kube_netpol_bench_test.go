package e2e

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
	networkingv1client "k8s.io/client-go/kubernetes/typed/networking/v1"
	"k8s.io/client-go/rest"

	"github.com/twill-net/twill/nl"
	"github.com/twill-net/twill/policy/cnpapi"
	"github.com/twill-net/twill/testsupport/kubetest"
	"github.com/twill-net/twill/testsupport/netnstest"
	"github.com/twill-net/twill/testsupport/policyscale"
)

// BenchmarkKubeNetworkPolicy measures twilld --network-policy as an
// operator runs it, against a real kube-apiserver holding 1,000 pods (a
// third of them on the measured node, which holds 10.244.0.0/23) in 10 namespaces and 500
// NetworkPolicies, as the policy package's scale benchmark builds them:
// the time from start to the first policy table in the kernel, from a pod
// label patched in the apiserver to twilld's write to the kernel (p50,
// p99; the patch call alone is the floor), then idle CPU and peak RSS.
func BenchmarkKubeNetworkPolicy(b *testing.B) {
	for range b.N {
		benchKubePolicy(b, kubePolicyScale{pods: 1000, policies: 500}, 0)
	}
}

// BenchmarkKubeNetworkPolicyAtScale is BenchmarkKubeNetworkPolicy at
// 10,000 pods (3,334 on the measured node, which holds 10.244.0.0/20) in
// 100 namespaces and 2,000 NetworkPolicies; under make bench-smoke, 2,000
// pods and 400 policies.
func BenchmarkKubeNetworkPolicyAtScale(b *testing.B) {
	sc := kubePolicyScale{pods: 10000, policies: 2000}
	if benchSmoke() {
		sc = kubePolicyScale{pods: 2000, policies: 400}
	}
	for range b.N {
		benchKubePolicy(b, sc, 0)
	}
}

// BenchmarkKubeClusterNetworkPolicyAtScale is
// BenchmarkKubeNetworkPolicyAtScale with 100 ClusterNetworkPolicies
// (policyscale.ClusterPolicies: 50 Admin, 50 Baseline) beside the 2,000
// NetworkPolicies; under make bench-smoke, 20 beside 400.
func BenchmarkKubeClusterNetworkPolicyAtScale(b *testing.B) {
	sc, cnps := kubePolicyScale{pods: 10000, policies: 2000}, 100
	if benchSmoke() {
		sc, cnps = kubePolicyScale{pods: 2000, policies: 400}, 20
	}
	for range b.N {
		benchKubePolicy(b, sc, cnps)
	}
}

// kubePolicyScale is the cluster benchKubePolicy builds: pods over three
// nodes, one namespace per 100 pods, one app per 20, ten policies per
// app (policy.BenchmarkPolicyChangeAtScale's).
type kubePolicyScale struct{ pods, policies int }

func (sc kubePolicyScale) namespaces() int { return max(sc.pods/100, 1) }
func (sc kubePolicyScale) apps() int       { return max(sc.pods/20, 1) }

// bits is the prefix length of each node's block: room for a third of
// the pods, and the network and gateway addresses.
func (sc kubePolicyScale) bits() int {
	bits := 32
	for size := 1; size < sc.pods/3+3; size *= 2 {
		bits--
	}
	return bits
}

// block is node n's block of 10.244.0.0/16.
func (sc kubePolicyScale) block(n int) netip.Prefix {
	return netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 244, byte(n << (32 - sc.bits()) >> 8), 0}), sc.bits())
}

// podIP is pod i's address: the (2+i/3)th of its node's block.
func (sc kubePolicyScale) podIP(i int) string {
	a := sc.block(i % 3).Addr().As4()
	v := uint32(a[0])<<24 | uint32(a[1])<<16 | uint32(a[2])<<8 | uint32(a[3]) + uint32(2+i/3)
	return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)}).String()
}

// BenchmarkKubeClusterNetworkPolicy is BenchmarkKubeNetworkPolicy with
// the ClusterNetworkPolicy CRD installed and 50 ClusterNetworkPolicies
// (policyscale.ClusterPolicies: 25 Admin, 25 Baseline) beside the 500
// NetworkPolicies; twilld also writes their status.
func BenchmarkKubeClusterNetworkPolicy(b *testing.B) {
	for range b.N {
		benchKubePolicy(b, kubePolicyScale{pods: 1000, policies: 500}, 50)
	}
}

func benchKubePolicy(b *testing.B, sc kubePolicyScale, cnps int) {
	k := newKubeClusterOn(b, 1, netip.MustParsePrefix("10.99.0.0/24"), "10.244.0.0/16", "host-gw")
	self := k.topo.Nodes[0]
	k.createNode(self.Name, sc.block(0).String(), self.Addr.Addr(), nil)
	api, err := newPolicyAPI(k.api.Admin)
	if err != nil {
		b.Fatal(err)
	}
	created := time.Now()
	policyScale(b, api, self.Name, sc)
	if cnps > 0 {
		createClusterPolicies(b, k.api, cnps)
	}
	b.Logf("%d namespaces, %d pods, %d NetworkPolicies and %d ClusterNetworkPolicies created in %s", sc.namespaces(), sc.pods, sc.policies, cnps,
		time.Since(created).Round(time.Millisecond))

	writes := watchPolicyTable(b, self.NS)
	b.ResetTimer()
	start := time.Now()
	d := k.startKubeDaemon(0, "--network-policy")
	select {
	case <-writes:
	case <-time.After(60 * time.Second):
		b.Fatalf("twilld wrote no policy table in 60 s; log:\n%s", d.Output())
	}
	startup := time.Since(start)

	// A local pod leaves every peer set its role is in, then joins those
	// of another role.
	var changes, patches []time.Duration
	samples := benchSamples
	if benchSmoke() {
		samples = 5 // that it runs, not its figures
	}
	for i := range 2 * samples {
		m := i % samples
		role := "none"
		if i >= samples {
			// Another role than the pod had before it left: should twilld
			// take the two changes in one compile, the table still changes
			// (back to the role it left, it would not, and no write come).
			role = fmt.Sprintf("r%d", (3*m+1)%7)
		}
		patch := fmt.Appendf(nil, `{"metadata":{"labels":{"role":%q}}}`, role)
		quiet(writes, 100*time.Millisecond, 10*time.Second)
		t0 := time.Now()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		_, err := api.CoreV1().Pods(fmt.Sprintf("ns%d", (3*m)%sc.namespaces())).Patch(ctx, fmt.Sprintf("p%d", 3*m), types.MergePatchType, patch, metav1.PatchOptions{})
		cancel()
		if err != nil {
			b.Fatalf("patching pod p%d: %v", 3*m, err)
		}
		patches = append(patches, time.Since(t0))
		select {
		case <-writes:
		case <-time.After(30 * time.Second):
			b.Fatalf("no policy table write within 30 s of p%d's role becoming %s; log:\n%s", 3*m, role, d.Output())
		}
		changes = append(changes, time.Since(t0))
	}
	idle := idleCPU(b, d.cmd.Process.Pid)
	rss := float64(peakRSS(b, d.cmd.Process.Pid)) / 1024
	b.StopTimer()

	b.ReportMetric(float64(startup.Milliseconds()), "start-to-table-ms")
	b.ReportMetric(ms(median(changes)), "label-to-kernel-p50-ms")
	b.ReportMetric(ms(quantile(changes, 0.99)), "label-to-kernel-p99-ms")
	b.ReportMetric(ms(median(patches)), "api-patch-p50-ms")
	b.ReportMetric(idle, "idle-cpu-%")
	b.ReportMetric(rss, "peak-rss-MiB")
	if os.Getenv("TWILL_BENCH_LOG") != "" {
		out := d.Output()
		b.Logf("twilld's log, last 6000 bytes:\n%s", out[max(0, len(out)-6000):])
	}
	b.Logf("kube, %d pods, %d policies and %d ClusterNetworkPolicies: start→policy table %s; label patch→kernel p50/p99 %s/%s (the patch call alone p50 %s); idle CPU %s; peak RSS %.1f MiB",
		sc.pods, sc.policies, cnps, startup.Round(time.Millisecond), r(median(changes)), r(quantile(changes, 0.99)), r(median(patches)), idleString(idle), rss)
}

// policyScale creates, in the apiserver, what the policy package's
// scaleOf holds for sc: at 1,000 pods, 10 namespaces, 1,000 pods over
// node and two more nodes' names (pod i on node i%3, sc.podIP(i), in
// 10.244.2(i%3).0/23, labelled app i%50 and role i%7, with a named port
// http 80), and 500 policies, each selecting one app and letting in two
// roles on port 80.
func policyScale(b *testing.B, api policyAPI, node string, sc kubePolicyScale) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	for i := range sc.namespaces() {
		name := fmt.Sprintf("ns%d", i)
		if _, err := api.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name,
			Labels: map[string]string{"tier": fmt.Sprint(i % 3)}}}, metav1.CreateOptions{}); err != nil {
			b.Fatalf("namespace %s: %v", name, err)
		}
		// No controller-manager creates the default ServiceAccount.
		if _, err := api.CoreV1().ServiceAccounts(name).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}},
			metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			b.Fatalf("ServiceAccount %s/default: %v", name, err)
		}
	}
	parallel(b, sc.pods, func(i int) error {
		nodeName := node
		if i%3 != 0 {
			nodeName = fmt.Sprintf("elsewhere-%d", i%3)
		}
		ip := sc.podIP(i)
		no := false
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: fmt.Sprintf("ns%d", i%sc.namespaces()), Name: fmt.Sprintf("p%d", i),
			Labels: map[string]string{"app": fmt.Sprintf("app%d", i%sc.apps()), "role": fmt.Sprintf("r%d", i%7)}},
			Spec: corev1.PodSpec{NodeName: nodeName, AutomountServiceAccountToken: &no, Containers: []corev1.Container{{Name: "c", Image: "stand-in.invalid/none",
				Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: 80}}}}}}
		p, err := api.CoreV1().Pods(p.Namespace).Create(ctx, p, metav1.CreateOptions{})
		if err != nil {
			return err
		}
		p.Status = corev1.PodStatus{Phase: corev1.PodRunning, PodIP: ip, PodIPs: []corev1.PodIP{{IP: ip}}}
		_, err = api.CoreV1().Pods(p.Namespace).UpdateStatus(ctx, p, metav1.UpdateOptions{})
		return err
	})
	p80 := intstr.FromInt32(80)
	parallel(b, sc.policies, func(i int) error {
		np := &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: fmt.Sprintf("ns%d", i%sc.namespaces()), Name: fmt.Sprintf("pol%d", i)},
			Spec: networkingv1.NetworkPolicySpec{PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": fmt.Sprintf("app%d", i%sc.apps())}},
				Ingress: []networkingv1.NetworkPolicyIngressRule{{
					From: []networkingv1.NetworkPolicyPeer{
						{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"role": fmt.Sprintf("r%d", i%7)}}},
						{NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"tier": fmt.Sprint(i % 3)}},
							PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"role": fmt.Sprintf("r%d", (i+1)%7)}}},
					},
					Ports: []networkingv1.NetworkPolicyPort{{Port: &p80}},
				}}}}
		_, err := api.NetworkingV1().NetworkPolicies(np.Namespace).Create(ctx, np, metav1.CreateOptions{})
		return err
	})
}

// createClusterPolicies installs the ClusterNetworkPolicy CRD and n
// policies (policyscale.ClusterPolicies) with kubectl.
func createClusterPolicies(b *testing.B, api *kubetest.APIServer, n int) {
	if out, err := api.Kubectl("apply", "--server-side", "-f", kubetest.ClusterPolicyCRD(b)); err != nil {
		b.Fatalf("kubectl apply the ClusterNetworkPolicy CRD: %v\n%s", err, out)
	}
	if out, err := api.Kubectl("wait", "--for", "condition=Established", "--timeout", "50s", "crd/clusternetworkpolicies.policy.networking.k8s.io"); err != nil {
		b.Fatalf("the ClusterNetworkPolicy CRD is not served: %v\n%s", err, out)
	}
	list := map[string]any{"apiVersion": "v1", "kind": "List"}
	var items []any
	for _, p := range policyscale.ClusterPolicies(n) {
		items = append(items, map[string]any{"apiVersion": cnpapi.Group + "/" + cnpapi.Version, "kind": "ClusterNetworkPolicy",
			"metadata": map[string]any{"name": p.Name}, "spec": p.Spec}) // no status: the CRD requires its conditions
	}
	list["items"] = items
	data, err := json.Marshal(list)
	if err != nil {
		b.Fatal(err)
	}
	file := filepath.Join(b.TempDir(), "cnps.json")
	if err := os.WriteFile(file, data, 0o600); err != nil {
		b.Fatal(err)
	}
	if out, err := api.Kubectl("create", "-f", file); err != nil {
		b.Fatalf("kubectl create %d ClusterNetworkPolicies: %v\n%s", n, err, out)
	}
}

// parallel runs do(0..n-1) over 16 workers and fails b on the first error.
func parallel(b *testing.B, n int, do func(int) error) {
	var wg sync.WaitGroup
	var mu sync.Mutex
	var first error
	work := make(chan int)
	for range 16 {
		wg.Go(func() {
			for i := range work {
				if err := do(i); err != nil {
					mu.Lock()
					first = cmp.Or(first, fmt.Errorf("item %d: %w", i, err))
					mu.Unlock()
				}
			}
		})
	}
	for i := range n {
		work <- i
	}
	close(work)
	wg.Wait()
	if first != nil {
		b.Fatal(first)
	}
}

// watchPolicyTable reports each batch another program (twilld) writes to
// the twill-policy table in netns name.
func watchPolicyTable(b *testing.B, name string) <-chan struct{} {
	target, err := ns.GetNS("/var/run/netns/" + name)
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	writes, subscribed, done := make(chan struct{}, 64), make(chan struct{}), make(chan struct{})
	watch := netnstest.WatchIn(target, func(ctx context.Context, sub, changed func()) error {
		return nl.WatchNftablesTable(ctx, "twill-policy", sub, changed)
	})
	go func() {
		defer close(done)
		if err := watch(ctx, func() { close(subscribed) }, func() {
			select {
			case writes <- struct{}{}:
			default:
			}
		}); err != nil {
			b.Error(err)
		}
	}()
	b.Cleanup(func() {
		cancel()
		<-done
		target.Close()
	})
	select {
	case <-subscribed:
	case <-done:
		b.Fatal("the nftables watch ended before it subscribed")
	}
	return writes
}

// quiet waits until c has been silent for d (at most until max has
// passed), dropping what it sends: the write a change is timed to is then
// one that came after it, not a late notification of an earlier write.
func quiet(c <-chan struct{}, d, max time.Duration) {
	end := time.Now().Add(max)
	for time.Now().Before(end) {
		select {
		case <-c:
		case <-time.After(d):
			return
		}
	}
}

// policyAPI is the two typed clients the benchmark uses; the whole
// clientset (k8s.io/client-go/kubernetes) would add about a hundred
// packages to the e2e binary's build.
type policyAPI struct {
	core       corev1client.CoreV1Interface
	networking networkingv1client.NetworkingV1Interface
}

func newPolicyAPI(cfg *rest.Config) (policyAPI, error) {
	core, err := corev1client.NewForConfig(cfg)
	if err != nil {
		return policyAPI{}, err
	}
	networking, err := networkingv1client.NewForConfig(cfg)
	if err != nil {
		return policyAPI{}, err
	}
	return policyAPI{core: core, networking: networking}, nil
}

func (a policyAPI) CoreV1() corev1client.CoreV1Interface { return a.core }

func (a policyAPI) NetworkingV1() networkingv1client.NetworkingV1Interface { return a.networking }
