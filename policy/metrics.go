package policy

import (
	"strings"

	"github.com/prometheus/client_golang/prometheus"
)

// Collector exports the policy table's packet counters, read from the
// kernel at each scrape: twill_netpol_packets_total{policy, verdict}.
// A policy's allowed packets are its rules'; its denied packets are the
// drops of the pods it selects, in the direction it isolates (a pod that
// several policies select counts against each). The kernel's counters
// start again from zero when a chain is rewritten (its policy changed).
type Collector struct {
	Counters func() (map[string]uint64, error)
	Enforcer *Enforcer
}

var packetsDesc = prometheus.NewDesc("twill_netpol_packets_total",
	"Packets allowed by a NetworkPolicy's rules, and denied to or from the pods it selects.", []string{"policy", "verdict"}, nil)

var unknownDesc = prometheus.NewDesc("twill_netpol_unknown_dropped_packets_total",
	"Packets dropped for an address of the node's pod CIDR whose pod twilld does not know yet.", nil, nil)

var unloggedDesc = prometheus.NewDesc("twill_netpol_denied_unlogged_packets_total",
	"Denied packets not sent to the verdict log: over its rate of LogRate a second per pod and direction.", nil, nil)

// Describe implements prometheus.Collector.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	ch <- packetsDesc
	ch <- unknownDesc
	ch <- unloggedDesc
}

// Collect implements prometheus.Collector.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	counts, err := c.Counters()
	if err != nil {
		ch <- prometheus.NewInvalidMetric(packetsDesc, err)
		return
	}
	type key struct{ policy, verdict string }
	sum := map[key]uint64{}
	var unknown, unlogged uint64
	for cmt, n := range counts {
		switch {
		case strings.HasPrefix(cmt, "allow "):
			sum[key{strings.TrimPrefix(cmt, "allow "), "allowed"}] += n
		case strings.HasPrefix(cmt, "deny ingress "):
			for _, p := range c.Enforcer.Selected(strings.TrimPrefix(cmt, "deny ingress ")).Ingress {
				sum[key{p, "denied"}] += n
			}
		case strings.HasPrefix(cmt, "deny egress "):
			for _, p := range c.Enforcer.Selected(strings.TrimPrefix(cmt, "deny egress ")).Egress {
				sum[key{p, "denied"}] += n
			}
		case strings.HasPrefix(cmt, "deny "+ClusterPolicyPrefix):
			sum[key{strings.TrimPrefix(cmt, "deny "), "denied"}] += n
		case strings.HasPrefix(cmt, "pass "+ClusterPolicyPrefix):
			sum[key{strings.TrimPrefix(cmt, "pass "), "passed"}] += n
		case strings.HasPrefix(cmt, "unknown "):
			unknown += n
		case strings.HasPrefix(cmt, UnloggedPrefix):
			unlogged += n
		}
	}
	for k, n := range sum {
		ch <- prometheus.MustNewConstMetric(packetsDesc, prometheus.CounterValue, float64(n), k.policy, k.verdict)
	}
	ch <- prometheus.MustNewConstMetric(unknownDesc, prometheus.CounterValue, float64(unknown))
	ch <- prometheus.MustNewConstMetric(unloggedDesc, prometheus.CounterValue, float64(unlogged))
}
