package plugin_test

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/twill-net/twill/lab/cnidriver"
)

const benchPods = 200

// podsToBench is benchPods, or 20 under make bench-smoke (that it runs,
// not its figures).
func podsToBench() int {
	if os.Getenv("TWILL_BENCH_SMOKE") != "" {
		return 20
	}
	return benchPods
}

func percentile(ds []time.Duration, p float64) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[min(len(s)-1, int(float64(len(s))*p))]
}

// BenchmarkCNIAddDel200 measures sequential ADD and DEL latency over 200
// pods driven through libcni: for twill alone; for twill as
// dist/10-twill.conflist ships it, serving portMappings itself, with pods
// without a host port (as most are) and with one each; for twill chained
// with portmap as it shipped before, the same two ways; and, in the same
// run, for the upstream ptp + host-local chain as the reference.
func BenchmarkCNIAddDel200(b *testing.B) {
	for range b.N {
		n := newNode(b, "10.244.0.0/24")
		pods := make([]cnidriver.Attachment, podsToBench())
		for i := range pods {
			pods[i] = n.pod(fmt.Sprintf("bench-%03d", i))
		}
		ptp := json.RawMessage(fmt.Sprintf(`{"cniVersion":"1.1.0","name":"ptpnet","plugins":[{"type":"ptp",
			"ipam":{"type":"host-local","subnet":"10.245.0.0/24","dataDir":%q}}]}`, filepath.Join(n.dir, "hl")))
		withHostPorts := make([]cnidriver.Attachment, len(pods))
		for i, p := range pods {
			withHostPorts[i] = withPorts(p, fmt.Sprintf(`{"hostPort":%d,"containerPort":80,"protocol":"tcp"}`, 20000+i))
		}
		portmap := n.conflist("1.1.0", `{"type":"portmap","capabilities":{"portMappings":true}}`)
		for _, tc := range []struct {
			name  string
			list  json.RawMessage
			ports bool
		}{
			{"twill", n.conflist("1.1.0"), false},
			{"twill-shipped", n.capConflist(), false}, {"twill-shipped-hostport", n.capConflist(), true},
			{"twill+portmap", portmap, false}, {"twill+portmap-hostport", portmap, true},
			{"ptp+host-local", ptp, false},
		} {
			atts := pods
			if tc.ports {
				atts = withHostPorts
			}
			measure := func(op string) []time.Duration {
				resp := n.run(cnidriver.Request{Op: op, ConfList: tc.list, Attachments: atts})
				mustOK(b, tc.name+" "+op, resp)
				ds := make([]time.Duration, len(resp.Outcomes))
				for i, o := range resp.Outcomes {
					ds[i] = o.Took
				}
				return ds
			}
			adds := measure("add")
			dels := measure("del")
			ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
			b.ReportMetric(ms(percentile(adds, 0.5)), tc.name+"-add-p50-ms")
			b.ReportMetric(ms(percentile(adds, 0.99)), tc.name+"-add-p99-ms")
			b.ReportMetric(ms(percentile(dels, 0.5)), tc.name+"-del-p50-ms")
			b.ReportMetric(ms(percentile(dels, 0.99)), tc.name+"-del-p99-ms")
			b.Logf("%-22s ADD p50 %6.1f ms p99 %6.1f ms   DEL p50 %6.1f ms p99 %6.1f ms", tc.name,
				ms(percentile(adds, 0.5)), ms(percentile(adds, 0.99)), ms(percentile(dels, 0.5)), ms(percentile(dels, 0.99)))
		}
		adds, dels, execs := batchFloor(b, n, pods)
		ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
		b.ReportMetric(ms(percentile(adds, 0.5)), "ip-batch-add-p50-ms")
		b.ReportMetric(ms(percentile(dels, 0.5)), "ip-batch-del-p50-ms")
		b.ReportMetric(ms(percentile(execs, 0.5)), "ip-exec-p50-ms")
		b.Logf("%-22s ADD p50 %6.1f ms p99 %6.1f ms   DEL p50 %6.1f ms p99 %6.1f ms   (of which one exec of ip: p50 %.1f ms)", "ip -batch floor",
			ms(percentile(adds, 0.5)), ms(percentile(adds, 0.99)), ms(percentile(dels, 0.5)), ms(percentile(dels, 0.99)), ms(percentile(execs, 0.5)))
		n.requireClean()
	}
}

// batchFloor wires the same pods the way twill does (a veth whose pod end
// is eth0, a /32 on it, a route to 169.254.1.1 and a default route through
// it; on the node, the host end up and a /32 route to the pod) with one
// `ip -batch` in the node's namespace and one in the pod's, and unwires
// them with `ip link del`: what a plugin costs at least, exec included
// (twill's proxy ARP sysctl and address bookkeeping left out). ADD takes
// two execs of ip (one per namespace) where a plugin needs one: execs is
// what one exec of ip costs alone, for the reader to subtract.
func batchFloor(b *testing.B, n *node, pods []cnidriver.Attachment) (adds, dels, execs []time.Duration) {
	dir := b.TempDir()
	run := func(ns, name, script string) {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, []byte(script), 0o644); err != nil {
			b.Fatal(err)
		}
		if out, err := exec.Command("ip", "-n", ns, "-batch", path).CombinedOutput(); err != nil {
			b.Fatalf("ip -n %s -batch %s: %v: %s", ns, name, err, out)
		}
	}
	for i, p := range pods {
		podNS, ip, host := filepath.Base(p.Netns), fmt.Sprintf("10.246.0.%d", i+1), fmt.Sprintf("twf%d", i)
		t0 := time.Now()
		run(n.ns, "node.batch", fmt.Sprintf("link add %s type veth peer name eth0 netns %s\nlink set %s up\nroute add %s/32 dev %s scope link\n", host, podNS, host, ip, host))
		run(podNS, "pod.batch", fmt.Sprintf("addr add %s/32 dev eth0\nlink set eth0 up\nroute add 169.254.1.1 dev eth0 scope link\nroute add default via 169.254.1.1 dev eth0\n", ip))
		adds = append(adds, time.Since(t0))
	}
	for i := range pods {
		t0 := time.Now()
		if out, err := exec.Command("ip", "-n", n.ns, "link", "del", fmt.Sprintf("twf%d", i)).CombinedOutput(); err != nil {
			b.Fatalf("ip link del: %v: %s", err, out)
		}
		dels = append(dels, time.Since(t0))
	}
	for range pods {
		t0 := time.Now()
		if out, err := exec.Command("ip", "-n", n.ns, "-V").CombinedOutput(); err != nil {
			b.Fatalf("ip -V: %v: %s", err, out)
		}
		execs = append(execs, time.Since(t0))
	}
	return adds, dels, execs
}
