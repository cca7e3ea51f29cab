// Package enforce runs Kubernetes NetworkPolicy and ClusterNetworkPolicy
// enforcement beside the daemon engine (daemon.Options.Policy): the
// informers, the enforcer and its nftables table, the verdict log, the
// ClusterNetworkPolicies' status, and the handlers and metrics they serve.
// twilld's --network-policy is this package with flags.
package enforce

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

	"github.com/twill-net/twill/nl"
	"github.com/twill-net/twill/plugin/allocations"
	"github.com/twill-net/twill/policy"
	"github.com/twill-net/twill/policy/cnpapi"
	"github.com/twill-net/twill/policy/verdictlog"
	kubesm "github.com/twill-net/twill/subnet/kube"
)

// Options configure the enforcement of one node.
type Options struct {
	Logger *slog.Logger
	// Client reaches the Kubernetes API (as the subnet manager does).
	Client kubesm.ClientOptions
	// Node is this node's name: the pods it enforces for are its own.
	Node string
	// LogDenied, LogAllowed and LogSample choose what the verdict log
	// records (twilld's --network-policy-log-*).
	LogDenied, LogAllowed bool
	LogSample             uint32
	// Verdicts is where verdict records go: JSON lines on stderr at level
	// VERDICT (VerdictLogger at info) when nil.
	Verdicts *slog.Logger
	// AllocationsDir holds the CNI plugin's allocations: the enforcer
	// reads which pod addresses are in use from it.
	AllocationsDir string
}

// Enforcement is one node's policy enforcement. A nil *Enforcement
// enforces nothing: its Run, Handlers and Collectors are empty.
type Enforcement struct {
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

// New checks that the kernel has nf_tables and sets up the enforcement;
// nothing runs before Run.
func New(o Options) (*Enforcement, error) {
	table := &policy.Table{}
	if err := table.Supported(); err != nil {
		return nil, fmt.Errorf("network policy writes table inet %s and needs the kernel's nf_tables (in every netfilter mode): %w", policy.TableName, err)
	}
	cfg, err := kubesm.RESTConfig(o.Client)
	if err != nil {
		return nil, err
	}
	inf, err := policy.NewInformers(cfg, o.Node)
	if err != nil {
		return nil, err
	}
	log := o.Logger.With("component", "network-policy")
	en := &Enforcement{table: table,
		apply: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "twill_netpol_apply_seconds",
			Help: "Time from a pod, namespace or policy change seen by twilld to its rules in the kernel.", Buckets: prometheus.ExponentialBuckets(0.0005, 2, 14)}),
		fixed: prometheus.NewCounter(prometheus.CounterOpts{Name: "twill_netpol_drift_repairs_total", Help: "Repairs of the policy table after it changed behind twilld's back."}),
	}
	en.e = &policy.Enforcer{Logger: log, Source: inf, Kernel: table, Node: o.Node, LogDenied: o.LogDenied,
		LogAllowed: o.LogAllowed, LogSample: o.LogSample,
		Watch: func(ctx context.Context, subscribed, changed func()) error {
			return nl.WatchNftablesTable(ctx, policy.TableName, subscribed, changed)
		}, Applied: func(d time.Duration) { en.apply.Observe(d.Seconds()) }, Repaired: en.fixed.Inc}
	en.e.Allocations = allocationsIn(o.AllocationsDir)
	verdicts := o.Verdicts
	if verdicts == nil {
		verdicts = VerdictLogger(slog.LevelInfo)
	}
	en.verdicts = &verdictlog.Log{Logger: verdicts, Node: o.Node, Namer: en.e}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	en.status = &policy.ClusterStatus{Logger: log, Node: o.Node, Apply: applyCondition(dyn)}
	en.e.Compiled = en.status.Update
	en.log = o.Logger
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

// VerdictLogger writes verdict records as JSON lines to stderr, at their
// own level, VERDICT, shown unless level is above it (warn or error).
func VerdictLogger(level slog.Level) *slog.Logger {
	return slog.New(slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: level, ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
		if a.Key == slog.LevelKey && a.Value.Any() == verdictlog.LevelVerdict {
			a.Value = slog.StringValue("VERDICT")
		}
		return a
	}}))
}

// Run is what daemon.Options.Policy takes: it enforces until ctx is done,
// calling synced once the table holds every policy of the first listing.
func (en *Enforcement) Run() func(ctx context.Context, local []netip.Prefix, synced func()) error {
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

// Handlers are what daemon.Options.Handlers serves: the verdict log
// (/verdicts) and a node's view of the policy (policy.SubsetPath).
func (en *Enforcement) Handlers() map[string]http.Handler {
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

// allocationsIn reads the CNI plugin's allocations in dir.
func allocationsIn(dir string) func() ([]policy.Allocation, error) {
	return func() ([]policy.Allocation, error) {
		rs, err := allocations.Records(dir)
		out := make([]policy.Allocation, len(rs))
		for i, r := range rs {
			out[i] = policy.Allocation{IP: r.IP, At: r.ModTime}
		}
		return out, err
	}
}

// Collectors are the enforcement's metrics (daemon.Options.Collectors).
func (en *Enforcement) Collectors() []prometheus.Collector {
	if en == nil {
		return nil
	}
	return []prometheus.Collector{en.apply, en.fixed, &policy.Collector{Counters: en.table.Counters, Enforcer: en.e}, en.verdicts}
}
