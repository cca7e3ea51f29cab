package policy

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"runtime"
	"runtime/metrics"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/twill-net/twill/nl"
	"github.com/twill-net/twill/nl/nft"
	"github.com/twill-net/twill/policy/cnpapi"
	"github.com/twill-net/twill/testsupport/netnstest"
	"github.com/twill-net/twill/testsupport/policyscale"
)

// scale is a cluster of 1,000 pods over 3 nodes in 10 namespaces, and 500
// policies: each selects one app's pods and lets in two roles on port 80.
// Node n holds 10.244.2n.0/23; pod i is on node i%3 at scalePodIP(i).
func scale() Snapshot { return scaleOf(1000, 500) }

// scaleOf is scale's cluster with pods pods (one namespace per 100, one
// app per 20) and policies policies (ten per app). Node n holds the n-th
// block of 10.244.0.0/16 big enough for its pods (a /23 at 1,000 pods, a
// /20 at 10,000).
func scaleOf(pods, policies int) Snapshot {
	s := Snapshot{Node: "n0", LocalCIDRs: []netip.Prefix{scaleBlock(pods, 0)}}
	namespaces, apps := max(pods/100, 1), max(pods/20, 1)
	for i := range namespaces {
		n := testNS(fmt.Sprintf("ns%d", i), map[string]string{"tier": fmt.Sprint(i % 3)})
		n.ResourceVersion = "1" // as the apiserver gives each object
		s.Namespaces = append(s.Namespaces, n)
	}
	for i := range pods {
		node := i % 3
		p := testPod(fmt.Sprintf("ns%d", i%namespaces), fmt.Sprintf("p%d", i), fmt.Sprintf("n%d", node), scalePodIPOf(pods, i),
			map[string]string{"app": fmt.Sprintf("app%d", i%apps), "role": fmt.Sprintf("r%d", i%7)},
			corev1.ContainerPort{Name: "http", ContainerPort: 80})
		p.ResourceVersion = "1"
		s.Pods = append(s.Pods, p)
	}
	p80 := intstr.FromInt32(80)
	for i := range policies {
		np := testPolicy(fmt.Sprintf("ns%d", i%namespaces), fmt.Sprintf("pol%d", i), map[string]string{"app": fmt.Sprintf("app%d", i%apps)}, func(sp *networkingv1.NetworkPolicySpec) {
			sp.Ingress = []networkingv1.NetworkPolicyIngressRule{{
				From: []networkingv1.NetworkPolicyPeer{
					{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"role": fmt.Sprintf("r%d", i%7)}}},
					{NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"tier": fmt.Sprint(i % 3)}},
						PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"role": fmt.Sprintf("r%d", (i+1)%7)}}},
				},
				Ports: []networkingv1.NetworkPolicyPort{{Port: &p80}},
			}}
		})
		np.ResourceVersion = "1"
		s.Policies = append(s.Policies, np)
	}
	return s
}

// scaleBlock is node n's block in a cluster of pods pods.
func scaleBlock(pods, n int) netip.Prefix {
	bits := 32
	for size := 1; size < pods/3+3; size *= 2 {
		bits--
	}
	base := netip.MustParseAddr("10.244.0.0").As4()
	v := (uint32(base[0])<<24 | uint32(base[1])<<16) + uint32(n)<<(32-bits)
	return netip.PrefixFrom(netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)}), bits)
}

// scalePodIP is pod i's address in scale(): the (2+i/3)th of its node's
// /23.
func scalePodIP(i int) string { return scalePodIPOf(1000, i) }

func scalePodIPOf(pods, i int) string {
	a := scaleBlock(pods, i%3).Addr().As4()
	v := uint32(a[0])<<24 | uint32(a[1])<<16 | uint32(a[2])<<8 | uint32(a[3])
	v += uint32(2 + i/3)
	return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)}).String()
}

// BenchmarkPolicyChange: a label change at 1,000 pods and 500 policies,
// from the informers' state to the kernel's table (Compile, then Sync's
// read, diff and write), p50 and p99 over 50 changes; and Compile alone.
func BenchmarkPolicyChange(b *testing.B) {
	benchChange(b, timed(newNode(b)), &Compiler{}, scale())
}

// BenchmarkClusterPolicyChange is BenchmarkPolicyChange with 50
// ClusterNetworkPolicies beside the 500 NetworkPolicies (scaleCluster).
func BenchmarkClusterPolicyChange(b *testing.B) {
	benchChange(b, timed(newNode(b)), &Compiler{}, scaleCluster())
}

// BenchmarkPolicyChangeAtScale is BenchmarkPolicyChange at 10,000 pods
// and 2,000 policies (the 3,334 local pods in a /20), and with 100
// ClusterNetworkPolicies beside them; it reports too the first write of
// the whole table (Compile and Sync: twilld's start → table, less the
// informers' lists) and the heap the compiled state and the table's model
// hold. Under make bench-smoke it runs at 2,000 pods and 400 policies.
func BenchmarkPolicyChangeAtScale(b *testing.B) {
	atScale(b, func(b *testing.B, s Snapshot, _ scaleSize) {
		n := timed(newNode(b))
		tb := n.tb
		runtime.GC()
		var before runtime.MemStats
		runtime.ReadMemStats(&before)
		peak := heapPeak()
		start := time.Now()
		k := &Compiler{} // as the enforcer holds it, with what it keeps for the next change
		rs := k.Compile(s).Ruleset
		_, err := tb.Sync(rs, false)
		first, heapAtPeak := time.Since(start), peak()
		if errors.Is(err, unix.EMSGSIZE) {
			// A limit of the design, measured (Documentation/benchmarks.md):
			// said and reported, not a failure of the run.
			rules, elems := rs.size()
			b.ReportMetric(0, "fits-one-transaction")
			b.ReportMetric(float64(rules), "rules")
			b.ReportMetric(float64(elems), "set-elements")
			b.Logf("DOES NOT FIT: %v", err)
			return
		} else if err != nil {
			b.Fatal(err)
		}
		runtime.GC()
		var after runtime.MemStats
		runtime.ReadMemStats(&after)
		benchChange(b, n, k, s) // resets the metrics reported before it
		// The kernel holds what was written: read back, nothing differs.
		if ch, err := tb.Sync(k.Compile(s).Ruleset, true); err != nil || !ch.Clean() {
			b.Fatalf("the table read back differs from what was written: %+v, %v", ch, err)
		}
		b.ReportMetric(float64(first.Milliseconds()), "first-write-ms")
		b.ReportMetric(float64(after.HeapInuse-min(after.HeapInuse, before.HeapInuse))/(1<<20), "table-model-heap-MiB")
		b.ReportMetric(float64(heapAtPeak)/(1<<20), "first-write-heap-peak-MiB")
	})
}

// scaleSize is the size of an at-scale benchmark's cluster.
type scaleSize struct{ pods, policies, cnps int }

// atScale runs f on the at-scale benchmarks' cluster (scaleOf: 10,000
// pods, 2,000 NetworkPolicies), once as it is and once with 100
// ClusterNetworkPolicies (policyscale); under make bench-smoke 2,000 pods,
// 400 NetworkPolicies and 20 ClusterNetworkPolicies.
func atScale(b *testing.B, f func(b *testing.B, s Snapshot, size scaleSize)) {
	size := scaleSize{10000, 2000, 100}
	if os.Getenv("TWILL_BENCH_SMOKE") != "" {
		size = scaleSize{2000, 400, 20}
	}
	for _, tc := range []struct {
		name string
		cnps int
	}{{"networkpolicies", 0}, {"with-clusternetworkpolicies", size.cnps}} {
		b.Run(tc.name, func(b *testing.B) {
			s := scaleOf(size.pods, size.policies)
			s.ClusterPolicies = versioned(policyscale.ClusterPolicies(tc.cnps))
			f(b, s, scaleSize{size.pods, size.policies, tc.cnps})
		})
	}
}

// heapPeak samples the heap's objects (the snapshot's included) every
// millisecond until the function it returns is called, which returns the
// largest sample.
func heapPeak() func() uint64 {
	done := make(chan struct{})
	var peak uint64
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		s := []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}}
		tick := time.NewTicker(time.Millisecond)
		defer tick.Stop()
		for {
			metrics.Read(s)
			peak = max(peak, s[0].Value.Uint64())
			select {
			case <-done:
				return
			case <-tick.C:
			}
		}
	}()
	return func() uint64 {
		close(done)
		wg.Wait()
		return peak
	}
}

// scaleCluster is scale() and 50 ClusterNetworkPolicies, 25 of each tier
// (policyscale.ClusterPolicies): every local pod is selected by eight or
// nine Admin policies and by the Baseline ones of its app.
func scaleCluster() Snapshot {
	s := scale()
	s.ClusterPolicies = versioned(policyscale.ClusterPolicies(50))
	return s
}

// versioned gives each policy a ResourceVersion, as the apiserver does.
func versioned(ps []*cnpapi.ClusterNetworkPolicy) []*cnpapi.ClusterNetworkPolicy {
	for _, p := range ps {
		p.ResourceVersion = "1"
	}
	return ps
}

// timedKernel times each transaction the kernel commits.
type timedKernel struct {
	nft.Kernel
	applied []time.Duration
}

func (k *timedKernel) Apply(b *nft.Batch) error {
	start := time.Now()
	err := k.Kernel.Apply(b)
	k.applied = append(k.applied, time.Since(start))
	return err
}

// timed makes n's table write through a timedKernel.
func timed(n *node) *node {
	n.tb.Kernel = &timedKernel{Kernel: nft.Conn{NetNS: n.tb.NetNS}}
	return n
}

// notifications follows n's nftables notifications until the benchmark
// ends, and returns a function that waits for the first one at or after
// a time, and says when it came (zero after 5 s without).
func notifications(b *testing.B, n *node) func(after time.Time) time.Time {
	target, err := ns.GetNS("/var/run/netns/" + n.name)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { target.Close() })
	ctx, cancel := context.WithCancel(context.Background())
	var mu sync.Mutex
	var last time.Time
	got := make(chan struct{}, 1)
	subscribed := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = netnstest.WatchIn(target, nl.WatchNftables)(ctx, func() { close(subscribed) }, func() {
			mu.Lock()
			last = time.Now()
			mu.Unlock()
			select {
			case got <- struct{}{}:
			default:
			}
		})
	}()
	b.Cleanup(func() { cancel(); <-done })
	select {
	case <-subscribed:
	case <-time.After(10 * time.Second):
		b.Fatal("no nftables subscription in 10 s")
	}
	return func(after time.Time) time.Time {
		deadline := time.After(5 * time.Second)
		for {
			mu.Lock()
			at := last
			mu.Unlock()
			if !at.Before(after) {
				return at
			}
			select {
			case <-got:
			case <-deadline:
				return time.Time{}
			}
		}
	}
}

// benchChange times twilld's share of a change: Compiler's compile, as
// the enforcer runs it, then the table's sync. Each change is a new pod
// object with a new ResourceVersion, as the informers give it.
func benchChange(b *testing.B, n *node, k *Compiler, s Snapshot) {
	tb := n.tb
	rs := k.Compile(s).Ruleset
	if _, err := tb.Sync(rs, false); err != nil {
		b.Fatal(err)
	}
	rules, elems := rs.size()

	var took, own, commit, seen []time.Duration
	var compile time.Duration
	tk := tb.Kernel.(*timedKernel)
	notified := notifications(b, n)
	incremental, rv := 0, 1
	for b.Loop() {
		for i := range 50 {
			p := s.Pods[i*3].DeepCopy() // a local pod, in or out of every set its role is in
			role := fmt.Sprintf("r%d", (i*3)%7)
			if p.Labels["role"] == role {
				role = "none"
			}
			rv++
			p.Labels, p.ResourceVersion = map[string]string{"app": p.Labels["app"], "role": role}, fmt.Sprint("c", rv)
			s.Pods[i*3] = p
			tk.applied = tk.applied[:0]
			start := time.Now()
			r := k.Compile(s)
			compile += time.Since(start)
			if k.Incremental {
				incremental++
			}
			ch, err := tb.Sync(r.Ruleset, false)
			took = append(took, time.Since(start))
			var kernel time.Duration
			for _, d := range tk.applied {
				kernel += d
			}
			commit, own = append(commit, kernel), append(own, took[len(took)-1]-kernel)
			if err != nil || ch.Clean() {
				b.Fatalf("Sync after a label change: %+v, %v", ch, err)
			}
			at := notified(start)
			if at.IsZero() {
				b.Fatal("no nftables notification of the change's write within 5 s")
			}
			seen = append(seen, at.Sub(start))
		}
	}
	for _, m := range []struct {
		name string
		d    []time.Duration
	}{{"change", took}, {"kernel", commit}, {"twill", own}, {"visible", seen}} {
		slices.Sort(m.d)
		b.ReportMetric(float64(m.d[len(m.d)/2].Microseconds())/1000, m.name+"-p50-ms")
		b.ReportMetric(float64(m.d[len(m.d)*99/100].Microseconds())/1000, m.name+"-p99-ms")
	}
	b.ReportMetric(float64(compile.Microseconds())/1000/float64(len(took)), "compile-ms")
	b.ReportMetric(float64(incremental)/float64(len(took)), "incremental")
	b.ReportMetric(float64(rules), "rules")
	b.ReportMetric(float64(elems), "set-elements")
}
