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
//     labs, and next to the tests alone in theirs. Once none is left to
//     run and no test alone in the Kubernetes labs' lane runs or waits,
//     the beside lane runs that lane's tests, a third Kubernetes lab: the
//     last of them, with the conformance suites, came after the light
//     tests had all ended, on a machine 40% idle (a fresh machine,
//     2026-11-29).
//
// The tests alone in the kubeLab lane used to run one by one before every
// other test, as go test runs tests that do not call t.Parallel: about 11
// minutes with a third of the two cores idle (sampled over a run,
// 2026-11-27), while the beside lane's 15 minutes of mostly waiting came
// after, on a machine the Kubernetes labs kept busy. make test runs go test
// with -parallel well above the number of tests, so that a test waiting
// for its lane never holds up another. make test runs the conformance
// suites' build, coverage and bench-smoke beside the tier, at a lower
// priority than every test here (Makefile, test-tiers).

// kubeLabSlots is how many Kubernetes labs run at once.
const kubeLabSlots = 2

var kubeLabLane, besideLane = tierLanes()

// tierLanes returns the Kubernetes labs' lane and the beside lane, which
// takes from it.
func tierLanes() (kube, beside *lane) {
	kube = newLane(kubeLabSlots, "TestKubeConformanceFast", "TestKubeClusterNetworkPolicyConformance", "TestDocs/kube")
	beside = newLane(1)
	beside.takeFrom(kube)
	return kube, beside
}

// kubeLab runs t in parallel, in the Kubernetes labs' lane.
func kubeLab(t *testing.T) { kubeLabLane.enter(t, 1) }

// kubeLabAfter runs t in parallel in the Kubernetes labs' lane, as kubeLab
// does, once prepare has run: what prepare does (the conformance tests
// write their images, at the lowest priority) happens while the lane's
// tests hold it, rather than in the tier's last minutes, where the
// conformance tests are the longest (their images took 47 s of the tier's
// end on a fresh machine, 2026-11-29); it waits for the tests alone on
// the machine to end first (machineAlone).
func kubeLabAfter(t *testing.T, prepare func()) {
	t.Parallel()
	waited := time.Now()
	machineAlone.Wait()
	if d := time.Since(waited); d > time.Second {
		t.Logf("waited %s for the tests alone on the machine before preparing", d.Round(time.Second))
	}
	prepare()
	kubeLabLane.wait(t, 1, kubeLabLane.rank(t.Name(), 1))
}

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
	machineAlone.Add(1) // before t.Parallel: every parallel test sees it
	t.Cleanup(machineAlone.Done)
	t.Parallel()
	sayAloneDone(t) // registered before the lanes' cleanups, so it runs after them
	kubeLabLane.wait(t, kubeLabSlots, rankFirst)
	besideLane.wait(t, 1, rankFirst)
}

// machineAlone counts the tests alone on the machine that have not ended.
// What kubeLabAfter prepares (images written at the lowest priority)
// waits for them: even niced, mkimage ran beside TestKubeLabWireGuard,
// the test meant to have the machine to itself (a fresh machine,
// 2026-11-29). The lane's other tests alone keep it for minutes after.
var machineAlone sync.WaitGroup

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
	mu      *sync.Mutex // shared with the lane it takes from or gives to
	free    int
	first   []string
	waiting []*waiter
	heavy   int         // tests of weight > 1 running
	settle  *time.Timer // admits a second after the last test asked
	// from, when set, is a lane whose tests of weight 1 this one runs when
	// it has none of its own left to run and from has no test of weight >
	// 1 running or waiting; to is the lane that takes from this one.
	from, to *lane
}

type waiter struct {
	rank   int
	weight int
	admit  chan struct{}
	by     *lane // the lane that admitted it, which gets the weight back
}

func newLane(free int, first ...string) *lane {
	return &lane{mu: new(sync.Mutex), free: free, first: first}
}

// takeFrom lets l run from's tests of weight 1 when it has room and none
// of its own waiting (see lane.from); the two then share one mutex. Call
// it before either lane admits a test.
func (l *lane) takeFrom(from *lane) {
	l.from, from.to = from, l
	l.mu = from.mu
}

// Ranks below those of the names in first: a lane admits rankFirst, then
// rankAlone, then first's names in their order, then the rest.
const (
	rankFirst = -2
	rankAlone = -1
)

func (l *lane) enter(t *testing.T, weight int) {
	t.Parallel()
	l.wait(t, weight, l.rank(t.Name(), weight))
}

// rank is where a test of weight named name goes among the lane's
// waiters.
func (l *lane) rank(name string, weight int) int {
	rank := slices.Index(l.first, name)
	switch {
	case weight > 1:
		return rankAlone
	case rank < 0:
		return len(l.first)
	}
	return rank
}

// wait blocks until the lane (or the lane that takes from it) admits t
// with weight, lower ranks first, and gives the weight back when t ends.
func (l *lane) wait(t *testing.T, weight, rank int) {
	w := &waiter{rank: rank, weight: weight, admit: make(chan struct{})}
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
		w.by.free += weight
		if weight > 1 {
			w.by.heavy--
		}
		l.mu.Unlock()
		w.by.admit()
		if w.by != l {
			l.admit()
		}
	})
}

// admit lets in the best-ranked waiting tests while the lane has room for
// them.
func (l *lane) admit() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.admitLocked()
}

func (l *lane) admitLocked() {
	for len(l.waiting) > 0 {
		best := bestWaiter(l.waiting)
		w := l.waiting[best]
		if w.weight > l.free {
			break
		}
		l.waiting = slices.Delete(l.waiting, best, best+1)
		l.let(w)
	}
	if len(l.waiting) == 0 && l.from != nil {
		l.takeLocked()
	}
	if l.to != nil {
		l.to.admitLocked()
	}
}

// takeLocked runs from's best-ranked tests of weight 1 in l's room, once
// from runs and awaits no test of weight > 1.
func (l *lane) takeLocked() {
	from := l.from
	if from.heavy > 0 || slices.ContainsFunc(from.waiting, func(w *waiter) bool { return w.weight > 1 }) {
		return
	}
	for len(from.waiting) > 0 && l.free > 0 {
		best := bestWaiter(from.waiting)
		w := from.waiting[best]
		from.waiting = slices.Delete(from.waiting, best, best+1)
		l.let(w)
	}
}

// let admits w in l.
func (l *lane) let(w *waiter) {
	w.by = l
	l.free -= w.weight
	if w.weight > 1 {
		l.heavy++
	}
	close(w.admit)
}

func bestWaiter(ws []*waiter) int {
	best := 0
	for i, w := range ws {
		if w.rank < ws[best].rank {
			best = i
		}
	}
	return best
}

// TestLaneAdmitsFirstRankBeforeEarlierArrivals: a test that takes both
// lanes goes before the beside tests queued ahead of it, rather than hold
// the Kubernetes lane idle while they all run.
func TestLaneAdmitsFirstRankBeforeEarlierArrivals(t *testing.T) {
	l := newLane(1)
	var queued []*waiter
	for _, rank := range []int{0, 0, 0, rankFirst} {
		w := &waiter{rank: rank, weight: 1, admit: make(chan struct{})}
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

// TestLaneTakesAnotherLanesTestsOnlyOnceTheyRunNoneAlone: the beside lane
// runs a Kubernetes lab only when it has no test of its own waiting and
// no test alone in the Kubernetes lane runs or waits; such a test gives
// its room back to the beside lane.
func TestLaneTakesAnotherLanesTestsOnlyOnceTheyRunNoneAlone(t *testing.T) {
	kube, beside := newLane(2), newLane(1)
	beside.takeFrom(kube)
	mk := func(rank, weight int) *waiter {
		return &waiter{rank: rank, weight: weight, admit: make(chan struct{})}
	}
	admitted := func(w *waiter) bool {
		select {
		case <-w.admit:
			return true
		default:
			return false
		}
	}
	own := mk(0, 1)
	alone, second := mk(rankAlone, 2), mk(rankAlone, 2)
	labs := []*waiter{mk(0, 1), mk(1, 1), mk(2, 1)}
	kube.waiting = append([]*waiter{alone, second}, labs...)
	beside.waiting = []*waiter{own}
	kube.admit()
	beside.admit()
	if !admitted(alone) || !admitted(own) || admitted(second) || slices.ContainsFunc(labs, admitted) {
		t.Fatal("want the alone test and the beside lane's own admitted, nothing else")
	}
	// The beside lane's own test ends: a test alone still waits.
	beside.free++
	beside.admit()
	if slices.ContainsFunc(labs, admitted) {
		t.Fatal("the beside lane took a Kubernetes lab while a test alone waits")
	}
	// The first alone test ends, the second runs: still none taken.
	kube.free, kube.heavy = kube.free+2, kube.heavy-1
	kube.admit()
	if !admitted(second) || slices.ContainsFunc(labs, admitted) {
		t.Fatal("want the second alone test admitted and no Kubernetes lab taken beside it")
	}
	// The second ends: the Kubernetes lane runs two, the beside lane the third.
	kube.free, kube.heavy = kube.free+2, kube.heavy-1
	kube.admit()
	for i, w := range labs {
		if !admitted(w) {
			t.Fatalf("lab %d not admitted", i)
		}
	}
	if labs[0].by != kube || labs[1].by != kube || labs[2].by != beside || beside.free != 0 {
		t.Fatalf("labs admitted by %p %p %p (kube %p, beside %p), beside's room %d; want the third in the beside lane",
			labs[0].by, labs[1].by, labs[2].by, kube, beside, beside.free)
	}
}
