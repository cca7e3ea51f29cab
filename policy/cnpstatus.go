package policy

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// ClusterStatus writes each ClusterNetworkPolicy's condition
// ConditionAccepted: True when twill enforces all of it, False with every
// problem (each names its field, and says what twill does instead).
//
// One twilld writes each policy: the one whose node rendezvous hashing
// picks for the policy's name among the Ready Nodes. Every twilld computes
// the same pick from the same Nodes, so that needs no Lease (nor the RBAC
// to write one), and the policies' writes spread over the nodes. While
// two twillds' views of the Nodes differ (a node just turned Ready), both
// may write one policy: the same condition, from the same object.
type ClusterStatus struct {
	Logger *slog.Logger
	Node   string
	// Apply writes one policy's condition (server-side apply of its
	// status, as field manager twilld).
	Apply func(ctx context.Context, name string, cond metav1.Condition) error

	mu   sync.Mutex
	want map[string]statusWant // guarded by mu
	kick chan struct{}
}

// ConditionAccepted is the condition twilld writes.
const ConditionAccepted = "Accepted"

// Reasons of ConditionAccepted.
const (
	ReasonEnforced    = "Enforced"
	ReasonNotInFull   = "NotEnforcedInFull"
	retryStatusWrites = 10 * time.Second
)

type statusWant struct {
	cond metav1.Condition
	have []metav1.Condition // the object's, as last seen
}

// Update computes, from a compile of s, the conditions of the policies
// this node writes, and has Run write those that differ.
func (w *ClusterStatus) Update(s Snapshot, r Result) {
	msgs := map[string][]string{}
	for _, p := range r.Problems {
		if name, ok := strings.CutPrefix(p.Policy, ClusterPolicyPrefix); ok {
			msgs[name] = append(msgs[name], p.Err.Error())
		}
	}
	nodes := readyNodes(s.Nodes)
	want := map[string]statusWant{}
	add := func(name string, gen int64, have []metav1.Condition) {
		if Writer(name, nodes) != w.Node {
			return
		}
		c := metav1.Condition{Type: ConditionAccepted, Status: metav1.ConditionTrue, Reason: ReasonEnforced, ObservedGeneration: gen,
			Message: "twill enforces every rule, in nftables"}
		if m := msgs[name]; len(m) > 0 {
			slices.Sort(m)
			c.Status, c.Reason = metav1.ConditionFalse, ReasonNotInFull
			c.Message = truncate(strings.Join(slices.Compact(m), "; "), 32768)
		}
		want[name] = statusWant{cond: c, have: have}
	}
	for _, p := range s.ClusterPolicies {
		add(p.Name, p.Generation, p.Status.Conditions)
	}
	for _, p := range s.ClusterPolicyErrors {
		add(strings.TrimPrefix(p.Policy, ClusterPolicyPrefix), 0, nil)
	}
	w.mu.Lock()
	w.want = want
	if w.kick == nil {
		w.kick = make(chan struct{}, 1)
	}
	w.mu.Unlock()
	poke(w.kick)
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n-3] + "..."
}

// readyNodes are the names of the Ready Nodes, or of all when none is.
func readyNodes(ns []*corev1.Node) []string {
	var ready, all []string
	for _, n := range ns {
		all = append(all, n.Name)
		for _, c := range n.Status.Conditions {
			if c.Type == corev1.NodeReady && c.Status == corev1.ConditionTrue {
				ready = append(ready, n.Name)
			}
		}
	}
	if len(ready) == 0 {
		return all
	}
	return ready
}

// Writer is the node that writes policy name's status among nodes: the
// one with the highest hash of the pair.
func Writer(name string, nodes []string) string {
	best, bestH := "", uint64(0)
	for _, n := range nodes {
		h := sha256.Sum256([]byte(n + "\x00" + name))
		if v := binary.BigEndian.Uint64(h[:8]); best == "" || v > bestH || v == bestH && n < best {
			best, bestH = n, v
		}
	}
	return best
}

// Run writes the conditions Update asks for until ctx is done; a failed
// write is tried again after retryStatusWrites.
func (w *ClusterStatus) Run(ctx context.Context) error {
	w.mu.Lock()
	if w.kick == nil {
		w.kick = make(chan struct{}, 1)
	}
	kick := w.kick
	w.mu.Unlock()
	retry := time.NewTimer(time.Hour)
	retry.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-kick:
		case <-retry.C:
		}
		if !w.writeAll(ctx) {
			retry.Reset(retryStatusWrites)
		}
	}
}

// writeAll writes each wanted condition the object does not hold yet; it
// reports whether all went through.
func (w *ClusterStatus) writeAll(ctx context.Context) bool {
	w.mu.Lock()
	want := w.want
	w.mu.Unlock()
	ok := true
	for _, name := range slices.Sorted(maps.Keys(want)) {
		sw := want[name]
		have := sw.have
		c := sw.cond
		if i := slices.IndexFunc(have, func(h metav1.Condition) bool { return h.Type == ConditionAccepted }); i >= 0 {
			h := have[i]
			if h.Status == c.Status && h.Reason == c.Reason && h.Message == c.Message && h.ObservedGeneration == c.ObservedGeneration {
				continue
			}
			if h.Status == c.Status {
				c.LastTransitionTime = h.LastTransitionTime
			}
		}
		if c.LastTransitionTime.IsZero() {
			c.LastTransitionTime = metav1.NewTime(time.Now().Truncate(time.Second))
		}
		if err := w.Apply(ctx, name, c); err != nil {
			w.Logger.Warn("writing a ClusterNetworkPolicy's status failed; trying again", "policy", name, "err", err)
			ok = false
			continue
		}
		if c.Status == metav1.ConditionFalse {
			w.Logger.Warn("ClusterNetworkPolicy not enforced in full", "policy", name, "why", c.Message)
		}
	}
	return ok
}
