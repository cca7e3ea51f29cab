package plugin_test

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/twill-net/twill/internal/cnidriver"
)

const benchPods = 200

func percentile(ds []time.Duration, p float64) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[min(len(s)-1, int(float64(len(s))*p))]
}

// BenchmarkCNIAddDel200 measures sequential ADD and DEL latency over 200
// pods driven through libcni, for twill and, in the same run, for the
// upstream ptp + host-local chain as the reference.
func BenchmarkCNIAddDel200(b *testing.B) {
	for range b.N {
		n := newNode(b, "10.244.0.0/24")
		pods := make([]cnidriver.Attachment, benchPods)
		for i := range pods {
			pods[i] = n.pod(fmt.Sprintf("bench-%03d", i))
		}
		ptp := json.RawMessage(fmt.Sprintf(`{"cniVersion":"1.1.0","name":"ptpnet","plugins":[{"type":"ptp",
			"ipam":{"type":"host-local","subnet":"10.245.0.0/24","dataDir":%q}}]}`, filepath.Join(n.dir, "hl")))
		for _, tc := range []struct {
			name string
			list json.RawMessage
		}{{"twill", n.conflist("1.1.0")}, {"ptp+host-local", ptp}} {
			measure := func(op string) []time.Duration {
				resp := n.run(cnidriver.Request{Op: op, ConfList: tc.list, Attachments: pods})
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
			b.Logf("%-15s ADD p50 %6.1f ms p99 %6.1f ms   DEL p50 %6.1f ms p99 %6.1f ms", tc.name,
				ms(percentile(adds, 0.5)), ms(percentile(adds, 0.99)), ms(percentile(dels, 0.5)), ms(percentile(dels, 0.99)))
		}
		n.requireClean()
	}
}
