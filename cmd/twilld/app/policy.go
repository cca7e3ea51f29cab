package app

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/twill-net/twill/internal/allocations"
	"github.com/twill-net/twill/internal/version"
	"github.com/twill-net/twill/nl"
	"github.com/twill-net/twill/policy"
	kubesm "github.com/twill-net/twill/subnet/kube"
)

// enforcement is --network-policy: the informers, the enforcer and its
// table.
type enforcement struct {
	e     *policy.Enforcer
	table *policy.Table
	apply prometheus.Histogram
	fixed prometheus.Counter
}

func newEnforcement(log *slog.Logger, o options, node string) (*enforcement, error) {
	table := &policy.Table{}
	if err := table.Supported(); err != nil {
		return nil, fmt.Errorf("--network-policy writes table inet %s and needs the kernel's nf_tables (in every --netfilter mode): %w", policy.TableName, err)
	}
	cfg, err := kubesm.RESTConfig(kubesm.ClientOptions{Kubeconfig: o.kubeconfigFile, APIURL: o.kubeAPIURL, UserAgent: "twilld/" + version.Version})
	if err != nil {
		return nil, err
	}
	inf, err := policy.NewInformers(cfg)
	if err != nil {
		return nil, err
	}
	en := &enforcement{table: table,
		apply: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "twill_netpol_apply_seconds",
			Help: "Time from a pod, namespace or policy change seen by twilld to its rules in the kernel.", Buckets: prometheus.ExponentialBuckets(0.0005, 2, 14)}),
		fixed: prometheus.NewCounter(prometheus.CounterOpts{Name: "twill_netpol_drift_repairs_total", Help: "Repairs of the policy table after it changed behind twilld's back."}),
	}
	en.e = &policy.Enforcer{Logger: log.With("component", "network-policy"), Source: inf, Kernel: table, Node: node, LogDenied: o.networkPolicyLog,
		Watch: func(ctx context.Context, subscribed, changed func()) error {
			return nl.WatchNftablesTable(ctx, policy.TableName, subscribed, changed)
		}, Applied: func(d time.Duration) { en.apply.Observe(d.Seconds()) }, Repaired: en.fixed.Inc}
	return en, nil
}

func (en *enforcement) run() func(ctx context.Context, local []netip.Prefix, synced func()) error {
	if en == nil {
		return nil
	}
	return func(ctx context.Context, local []netip.Prefix, synced func()) error {
		en.e.Synced = synced
		return en.e.Run(ctx, local)
	}
}

// allocations has the enforcer read the CNI plugin's allocations in dir.
func (en *enforcement) allocations(dir string) {
	en.e.Allocations = func() ([]policy.Allocation, error) {
		rs, err := allocations.Records(dir)
		out := make([]policy.Allocation, len(rs))
		for i, r := range rs {
			out[i] = policy.Allocation{IP: r.IP, At: r.ModTime}
		}
		return out, err
	}
}

func (en *enforcement) collectors() []prometheus.Collector {
	if en == nil {
		return nil
	}
	return []prometheus.Collector{en.apply, en.fixed, &policy.Collector{Counters: en.table.Counters, Enforcer: en.e}}
}
