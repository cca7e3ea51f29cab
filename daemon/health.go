package daemon

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

func (d *Daemon) serveHealth(ctx context.Context, ln net.Listener) error {
	mux := http.NewServeMux()
	// Read-only: GET (and HEAD) alone; any other method is refused with
	// 405, and nothing served changes state.
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		last := time.Unix(0, d.heartbeat.Load())
		if since := time.Since(last); since > 3*d.o.Resync+10*time.Second {
			http.Error(w, fmt.Sprintf("reconcile loop stalled for %s", since.Round(time.Second)), http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		if m := d.o.Subnets.Monitor; m != nil {
			if up, why := m.Connected(); !up {
				http.Error(w, "not ready: "+why, http.StatusServiceUnavailable)
				return
			}
		}
		if !d.ready.Load() {
			http.Error(w, "not ready: lease, rules, subnet.env, first reconcile or kernel watch pending", http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ok")
	})
	mux.Handle("GET /metrics", promhttp.HandlerFor(d.metrics.reg, promhttp.HandlerOpts{}))
	for path, h := range d.o.Handlers {
		mux.Handle("GET "+path, h)
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}()
	if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("serving health endpoints: %w", err)
	}
	return nil
}

type metrics struct {
	reg               *prometheus.Registry
	leases            prometheus.Gauge
	refused           prometheus.Gauge
	unroutable        prometheus.Gauge
	reconcileDuration prometheus.Histogram
	reconcileErrors   prometheus.Counter
	driftRepairs      prometheus.Counter
	reclaimed         prometheus.Counter
}

func newMetrics() *metrics {
	m := &metrics{
		reg:        prometheus.NewRegistry(),
		leases:     prometheus.NewGauge(prometheus.GaugeOpts{Name: "twill_leases", Help: "Valid peer leases handed to the backend."}),
		refused:    prometheus.NewGauge(prometheus.GaugeOpts{Name: "twill_leases_refused", Help: "Leases refused (malformed, outside Network, overlapping, wrong backend)."}),
		unroutable: prometheus.NewGauge(prometheus.GaugeOpts{Name: "twill_peers_unroutable", Help: "Peers the backend cannot reach (host-gw: public IP not on-link)."}),
		reconcileDuration: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "twill_reconcile_duration_seconds", Help: "Time to reconcile the backend with the lease set.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 14)}),
		reconcileErrors: prometheus.NewCounter(prometheus.CounterOpts{Name: "twill_reconcile_errors_total", Help: "Reconciles that returned an error."}),
		driftRepairs:    prometheus.NewCounter(prometheus.CounterOpts{Name: "twill_drift_repairs_total", Help: "Kernel objects repaired because they drifted from what twill programmed."}),
	}
	m.reclaimed = prometheus.NewCounter(prometheus.CounterOpts{Name: "twill_addresses_reclaimed_total",
		Help: "Pod address allocations released because their pod was gone (its DEL never came)."})
	m.reg.MustRegister(m.leases, m.refused, m.unroutable, m.reconcileDuration, m.reconcileErrors, m.driftRepairs, m.reclaimed)
	// The Go runtime's and the process's own, as every Prometheus exporter
	// has them: go_gc_heap_live_bytes (the heap the last GC kept) tells
	// whether twilld keeps what it was sent.
	m.reg.MustRegister(collectors.NewGoCollector(collectors.WithGoCollectorRuntimeMetrics(collectors.MetricsGC)),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// connected exports whether the subnet manager reaches its datastore.
func (m *metrics) connected(mon Monitor) {
	m.reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "twill_subnet_manager_connected",
		Help: "1 while the subnet manager reaches its datastore (etcd), 0 while it cannot."},
		func() float64 {
			if ok, _ := mon.Connected(); ok {
				return 1
			}
			return 0
		}))
}

// conflicts exports the lease conflicts seen: records refused for
// claiming a public IP another lease holds, and (etcd mode) overwrites of
// this node's own lease by another client.
func (m *metrics) conflicts(peers *peerSet, own ConflictCounter) {
	m.reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "twill_lease_conflicts_total",
		Help: "Leases refused for claiming a public IP another lease holds, and overwrites of this node's own lease by another client."},
		func() float64 {
			n := peers.conflictCount()
			if own != nil {
				n += own.OwnLeaseConflicts()
			}
			return float64(n)
		}))
}
