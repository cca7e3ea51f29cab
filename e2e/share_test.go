package e2e

import (
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"
)

// How the e2e tier shares the machine's two cores.
//
// Every test runs in parallel, in one of two lanes:
//   - kubeLab: a Kubernetes lab (a control plane, and a containerd and a
//     kubelet per node) keeps about a core busy: two run at once, the
//     longest first, so that the longest does not start last. The tests
//     that bound a gap in traffic, or when a pod starts against twilld,
//     under their own load take the whole lane (alone) and go before the
//     others: the flannel takeovers and the Kubernetes labs with probers
//     (TestKubeLab, TestKubeLabWireGuard, TestKubeLabFlannelTakeover,
//     TestKubeNetworkPolicy, TestFlannelTakeover); TestKubeLabWireGuard
//     takes the beside lane too (aloneOnMachine);
//   - beside: an etcd cluster of namespaces, a lone apiserver or a lab
//     without Kubernetes mostly waits (15-30% of the two cores, one by one,
//     sampled over a CI run): one runs at a time, next to the Kubernetes
//     labs, and next to the tests alone in theirs.
//
// The tests alone in the kubeLab lane used to run one by one before every
// other test, as go test runs tests that do not call t.Parallel: about 11
// minutes with a third of the two cores idle (sampled over a run,
// 2026-11-27), while the beside lane's 15 minutes of mostly waiting came
// after, on a machine the Kubernetes labs kept busy. make test runs go test
// with -parallel well above the number of tests, so that a test waiting
// for its lane never holds up another. make test runs the conformance
// suites' build and bench-smoke beside the tier, at a lower priority than
// every test here (Makefile, test-tiers).

// kubeLabSlots is how many Kubernetes labs run at once.
const kubeLabSlots = 2

var (
	kubeLabLane = &lane{free: kubeLabSlots, first: []string{"TestKubeConformanceFast", "TestDocs/kube"}}
	besideLane  = &lane{free: 1}
)

// kubeLab runs t in parallel, in the Kubernetes labs' lane.
func kubeLab(t *testing.T) { kubeLabLane.enter(t, 1) }

// alone runs t in parallel, alone in the Kubernetes labs' lane, before the
// tests that share it.
func alone(t *testing.T) { kubeLabLane.enter(t, kubeLabSlots) }

// beside runs t in parallel, in the lane of the tests that mostly wait.
func beside(t *testing.T) { besideLane.enter(t, 1) }

// aloneOnMachine runs t in parallel with both lanes to itself: the whole
// Kubernetes lane, then the beside lane, each before any other test waiting
// for it. It once queued behind every beside test (about 40, 8.5 minutes
// on a fresh machine, 2026-11-28) while holding the Kubernetes lane, which
// then stood idle: it goes first now, when only the beside test already
// running stands in its way. TestKubeLabWireGuard's key
// rotation (userspace WireGuard here) broke held connections between
// node1 and node3 in a make test run with a beside test next to it (4,
// 2026-11-27) and in a run next to another make test (2); in an earlier
// make test run, none. It gets the machine to itself, not a looser bound:
// make test starts bench-smoke beside the tier once such a test has ended,
// as the file named by AloneDoneEnv says. (With a kernel matrix's emulated
// machines beside it, a kube-apiserver restart broke 38 held connections,
// on a fresh machine, 2026-11-29.)
func aloneOnMachine(t *testing.T) {
	t.Parallel()
	sayAloneDone(t) // registered before the lanes' cleanups, so it runs after them
	kubeLabLane.wait(t, kubeLabSlots, rankFirst)
	besideLane.wait(t, 1, rankFirst)
}

// sayAloneDone writes the file AloneDoneEnv names, if any, when t has
// ended.
func sayAloneDone(t *testing.T) {
	f := os.Getenv(AloneDoneEnv)
	if f == "" {
		return
	}
	t.Cleanup(func() {
		if err := os.WriteFile(f, []byte(t.Name()+"\n"), 0o644); err != nil {
			t.Errorf("%s: %v", AloneDoneEnv, err)
		}
	})
}

// AloneDoneEnv names a file a test alone on the machine writes when it has
// ended and given the lanes back (make test sets it).
const AloneDoneEnv = "TWILL_E2E_ALONE_DONE"

// A lane runs tests whose weights add up to at most free at once: the
// heaviest (alone) first, then those named in first, then the others in the
// order they came. The best-ranked test waits for room rather than let
// lighter ones pass it, so that a test alone in the lane is not starved.
type lane struct {
	mu      sync.Mutex
	free    int
	first   []string
	waiting []waiter
	settle  *time.Timer // admits a second after the last test asked
}

type waiter struct {
	rank   int
	weight int
	admit  chan struct{}
}

// Ranks below those of the names in first: a lane admits rankFirst, then
// rankAlone, then first's names in their order, then the rest.
const (
	rankFirst = -2
	rankAlone = -1
)

func (l *lane) enter(t *testing.T, weight int) {
	t.Parallel()
	rank := slices.Index(l.first, t.Name())
	switch {
	case weight > 1:
		rank = rankAlone
	case rank < 0:
		rank = len(l.first)
	}
	l.wait(t, weight, rank)
}

// wait blocks until the lane admits t with weight, lower ranks first, and
// gives the weight back when t ends.
func (l *lane) wait(t *testing.T, weight, rank int) {
	w := waiter{rank: rank, weight: weight, admit: make(chan struct{})}
	// Admission waits until no test has asked for a second: go test
	// releases its parallel tests in a burst, in the goroutines' order, and
	// a free slot must go to the best-ranked of the burst, not the first.
	// (A sequential test's parallel subtests, run before that burst, once
	// set off a one-time gathering early, and the burst came in the
	// goroutines' order.)
	l.mu.Lock()
	l.waiting = append(l.waiting, w)
	if l.settle == nil {
		l.settle = time.AfterFunc(time.Second, l.admit)
	} else {
		l.settle.Reset(time.Second)
	}
	l.mu.Unlock()
	asked := time.Now()
	<-w.admit
	// go test counts the wait in the test's time: say how much of it it was.
	if waited := time.Since(asked); waited > 2*time.Second {
		t.Logf("waited %s for its lane", waited.Round(time.Second))
	}
	// Registered first, so it runs after every cleanup the test adds: the
	// next test starts once this one's namespaces and processes are gone.
	t.Cleanup(func() {
		l.mu.Lock()
		l.free += weight
		l.mu.Unlock()
		l.admit()
	})
}

// admit lets in the best-ranked waiting tests while the lane has room for
// them.
func (l *lane) admit() {
	l.mu.Lock()
	defer l.mu.Unlock()
	for len(l.waiting) > 0 {
		best := 0
		for i, w := range l.waiting {
			if w.rank < l.waiting[best].rank {
				best = i
			}
		}
		w := l.waiting[best]
		if w.weight > l.free {
			return
		}
		close(w.admit)
		l.waiting = slices.Delete(l.waiting, best, best+1)
		l.free -= w.weight
	}
}

// TestLaneAdmitsFirstRankBeforeEarlierArrivals: a test that takes both
// lanes goes before the beside tests queued ahead of it, rather than hold
// the Kubernetes lane idle while they all run.
func TestLaneAdmitsFirstRankBeforeEarlierArrivals(t *testing.T) {
	l := &lane{free: 1}
	var queued []waiter
	for _, rank := range []int{0, 0, 0, rankFirst} {
		w := waiter{rank: rank, weight: 1, admit: make(chan struct{})}
		queued = append(queued, w)
		l.waiting = append(l.waiting, w)
	}
	l.admit()
	for i, w := range queued {
		select {
		case <-w.admit:
			if w.rank != rankFirst {
				t.Fatalf("admitted waiter %d (rank %d) before the one ranked first", i, w.rank)
			}
		default:
			if w.rank == rankFirst {
				t.Fatalf("the waiter ranked first still waits behind %d earlier arrivals", len(queued)-1)
			}
		}
	}
}

// TestAloneDoneWrittenWhenTheTestEnds: make test starts bench-smoke when
// the file appears, so it must not appear while the test alone on the
// machine still runs, and must once it has ended.
func TestAloneDoneWrittenWhenTheTestEnds(t *testing.T) {
	f := filepath.Join(t.TempDir(), "alone-done")
	t.Run("alone", func(t *testing.T) {
		t.Setenv(AloneDoneEnv, f)
		sayAloneDone(t)
		if _, err := os.Stat(f); err == nil {
			t.Fatalf("%s written while the test runs", f)
		}
	})
	if b, err := os.ReadFile(f); err != nil || string(b) != "TestAloneDoneWrittenWhenTheTestEnds/alone\n" {
		t.Fatalf("after the test ended, %s: %q, %v; want the test's name", f, b, err)
	}
}
