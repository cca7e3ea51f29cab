package app

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/netip"
	"os"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/dynamic"

	"github.com/twill-net/twill/internal/version"
	"github.com/twill-net/twill/nl"
	"github.com/twill-net/twill/plugin/allocations"
	"github.com/twill-net/twill/policy"
	"github.com/twill-net/twill/policy/cnpapi"
	"github.com/twill-net/twill/policy/verdictlog"
	kubesm "github.com/twill-net/twill/subnet/kube"
)

// enforcement is --network-policy: the informers, the enforcer and its
// table.
type enforcement struct {
	e     *policy.Enforcer
	table *policy.Table
	apply prometheus.Histogram
	fixed prometheus.Counter
	// verdicts is the verdict log: it reads what the table logs.
	verdicts *verdictlog.Log
	// status writes the ClusterNetworkPolicies' conditions.
	status *policy.ClusterStatus
	log    *slog.Logger
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
		LogAllowed: o.networkPolicyAllowed, LogSample: o.networkPolicySample,
		Watch: func(ctx context.Context, subscribed, changed func()) error {
			return nl.WatchNftablesTable(ctx, policy.TableName, subscribed, changed)
		}, Applied: func(d time.Duration) { en.apply.Observe(d.Seconds()) }, Repaired: en.fixed.Inc}
	en.verdicts = &verdictlog.Log{Logger: verdictLogger(o.logLevel), Node: node, Namer: en.e}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	en.status = &policy.ClusterStatus{Logger: log.With("component", "network-policy"), Node: node, Apply: applyCondition(dyn)}
	en.e.Compiled = en.status.Update
	en.log = log
	return en, nil
}

// applyCondition writes a ClusterNetworkPolicy's condition by server-side
// apply of its status: twilld owns that condition and nothing else of the
// object (clusternetworkpolicies/status patch).
func applyCondition(dyn dynamic.Interface) func(ctx context.Context, name string, c metav1.Condition) error {
	res := dyn.Resource(cnpapi.GroupVersionResource)
	return func(ctx context.Context, name string, c metav1.Condition) error {
		cond, err := runtime.DefaultUnstructuredConverter.ToUnstructured(&c)
		if err != nil {
			return err
		}
		obj := &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": cnpapi.Group + "/" + cnpapi.Version, "kind": cnpapi.Kind,
			"metadata": map[string]any{"name": name},
			"status":   map[string]any{"conditions": []any{cond}},
		}}
		_, err = res.ApplyStatus(ctx, name, obj, metav1.ApplyOptions{FieldManager: "twilld", Force: true})
		return err
	}
}

// verdictLogger writes verdict records as JSON lines to twilld's stderr,
// at their own level, VERDICT, shown unless --log-level is warn or error.
func verdictLogger(level string) *slog.Logger {
	var l slog.Level
	_ = l.UnmarshalText([]byte(level)) // checked by newLogger
	return slog.New(slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: l, ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
		if a.Key == slog.LevelKey && a.Value.Any() == verdictlog.LevelVerdict {
			a.Value = slog.StringValue("VERDICT")
		}
		return a
	}}))
}

func (en *enforcement) run() func(ctx context.Context, local []netip.Prefix, synced func()) error {
	if en == nil {
		return nil
	}
	return func(ctx context.Context, local []netip.Prefix, synced func()) error {
		en.e.Synced = synced
		// The verdict log is for people: without it (no nfnetlink_log,
		// say), policy is enforced all the same, by a table that does not
		// log (a log rule the kernel cannot load would fail the table).
		wait, err := en.verdicts.Start(ctx)
		if err != nil {
			en.log.Warn("the verdict log cannot read NFLOG; policy is enforced, without logging", "err", err)
			en.e.LogOff = true
		} else {
			go func() {
				if err := wait(); err != nil {
					en.log.Warn("the verdict log stopped; policy is enforced, its verdicts are no longer read", "err", err)
				}
			}()
		}
		go func() { _ = en.status.Run(ctx) }()
		return en.e.Run(ctx, local)
	}
}

func (en *enforcement) handlers() map[string]http.Handler {
	if en == nil {
		return nil
	}
	return map[string]http.Handler{"/verdicts": en.verdicts, policy.SubsetPath: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		full := en.e.Ruleset()
		v := policy.NodeView{Ruleset: full.Subset(q["pod"], q["ip"])}
		var err error
		if v.Drifted, err = en.table.Drifted(full, v.Ruleset); err != nil {
			v.DriftErr = err.Error()
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(v)
	})}
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
	return []prometheus.Collector{en.apply, en.fixed, &policy.Collector{Counters: en.table.Counters, Enforcer: en.e}, en.verdicts}
}
