package lab

import (
	"context"
	"fmt"
	"io"
	"net/netip"
	"sort"
	"strings"
	"time"
)

// HoldPlan is who holds connections to whom (lab check --hold): every pod
// to each address of every pod on another node, and in a Kubernetes lab
// to the echo Service's ClusterIP too.
func HoldPlan(ctx context.Context, s *State) (from []Vantage, to []Target, pairs func(Vantage, Target) bool, err error) {
	if s.Kubernetes {
		if err := s.refreshPods(ctx); err != nil {
			return nil, nil, nil, err
		}
	}
	node := map[string]string{} // vantage or target name → its node
	for _, p := range s.Pods {
		nsPath := "/var/run/netns/" + p.NS
		name := p.Name
		if s.Kubernetes {
			if nsPath, err = PodNetNS(s, p); err != nil {
				return nil, nil, nil, err
			}
			name = p.Label()
		}
		from = append(from, Vantage{Name: name, NetNS: nsPath})
		node[name] = p.Node
		for i, a := range p.Addrs() {
			tn := name
			if i > 0 {
				tn += "-v6"
			}
			to = append(to, Target{Name: tn, Addr: netip.AddrPortFrom(a, EchoPort)})
			node[tn] = p.Node
		}
	}
	if s.Kubernetes {
		svc, err := s.echoServiceTargets(ctx)
		if err != nil {
			return nil, nil, nil, err
		}
		to = append(to, svc...)
	}
	pairs = func(v Vantage, t Target) bool {
		tn, ok := node[t.Name]
		return !ok || tn != node[v.Name] // a Service, or another node's pod
	}
	return from, to, pairs, nil
}

// HoldCheck holds every pair of HoldPlan for d and prints what each saw;
// it returns the whole span's summary.
func HoldCheck(ctx context.Context, s *State, binDir string, d time.Duration, w io.Writer) (HoldSummary, error) {
	from, to, pairs, err := HoldPlan(ctx, s)
	if err != nil {
		return HoldSummary{}, err
	}
	start := time.Now()
	run := StartHold(ctx, binDir, from, to, pairs, d)
	if errs := run.Wait(); len(errs) > 0 {
		return HoldSummary{}, fmt.Errorf("holding connections: %v", errs)
	}
	end := time.Now()
	byPair := map[string]HoldSummary{}
	run.mu.Lock()
	names := map[string][2]string{}
	for _, rec := range run.records {
		names[rec.From+" -> "+rec.To] = [2]string{rec.From, rec.To}
	}
	run.mu.Unlock()
	for k := range names {
		byPair[k] = run.pairSummary(names[k][0], names[k][1], start, end)
	}
	keys := make([]string, 0, len(byPair))
	for k := range byPair {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	fmt.Fprintf(w, "held for %s, a heartbeat every %s on each connection (a stall over %s breaks it):\n", d, HoldBeat, HoldStall)
	for _, k := range keys {
		fmt.Fprintf(w, "  %s: %s\n", k, strings.TrimPrefix(byPair[k].String(), "1 pairs: "))
	}
	sum := run.Summary(start, end)
	fmt.Fprintf(w, "all: %s\n", sum)
	for _, e := range sum.Errors {
		fmt.Fprintf(w, "  broken: %s\n", e)
	}
	return sum, nil
}

// pairSummary is Summary for one pair.
func (r *HoldRun) pairSummary(from, to string, start, end time.Time) HoldSummary {
	one := &HoldRun{}
	r.mu.Lock()
	for _, rec := range r.records {
		if rec.From == from && rec.To == to {
			one.records = append(one.records, rec)
		}
	}
	r.mu.Unlock()
	return one.Summary(start, end)
}
