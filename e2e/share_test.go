package e2e

import (
	"slices"
	"sync"
	"testing"
	"time"
)

// How the e2e tier shares the machine's two cores.
//
// go test first runs, one at a time, the tests that do not call
// t.Parallel. Those are the tests that bound a gap in traffic, or when a pod
// starts against twilld, under their own load alone: the flannel takeovers
// and the Kubernetes labs with probers (TestKubeLab, TestKubeLabWireGuard,
// TestKubeLabFlannelTakeover, TestKubeNetworkPolicy).
//
// Every other test then runs beside the others, in one of two lanes:
//   - kubeLab: a Kubernetes lab (a control plane, and a containerd and a
//     kubelet per node) keeps about a core busy: two run at once, the
//     longest first, so that the longest does not start last;
//   - beside: an etcd cluster of namespaces, a lone apiserver or a lab
//     without Kubernetes mostly waits (15-30% of the two cores, one by one,
//     sampled over a CI run): one runs at a time, next to the Kubernetes
//     labs.
//
// Before the lanes, the light tests ran one by one before every parallel
// test: about 8 minutes of a mostly idle machine. make test runs go test
// with -parallel well above the number of parallel tests, so that a test
// waiting for its lane never holds up another.
var (
	kubeLabLane = &lane{free: 2, first: []string{"TestKubeConformanceFast", "TestDocs"}}
	besideLane  = &lane{free: 1}
)

// kubeLab runs t in parallel, in the Kubernetes labs' lane.
func kubeLab(t *testing.T) { kubeLabLane.enter(t) }

// beside runs t in parallel, in the lane of the tests that mostly wait.
func beside(t *testing.T) { besideLane.enter(t) }

// A lane runs at most free tests at once: those named in first before the
// others, then in the order they came.
type lane struct {
	mu      sync.Mutex
	free    int
	first   []string
	waiting []waiter
}

type waiter struct {
	rank  int
	admit chan struct{}
}

// gathered closes a second after the first parallel test asks for a lane:
// go test releases every parallel test at once when the sequential ones
// are done, and by then each has asked, so that the order of the first
// admissions is the lanes' and not the goroutines'.
var (
	gatherOnce sync.Once
	gathered   = make(chan struct{})
)

func (l *lane) enter(t *testing.T) {
	t.Parallel()
	gatherOnce.Do(func() { time.AfterFunc(time.Second, func() { close(gathered) }) })
	rank := slices.Index(l.first, t.Name())
	if rank < 0 {
		rank = len(l.first)
	}
	w := waiter{rank: rank, admit: make(chan struct{})}
	l.mu.Lock()
	l.waiting = append(l.waiting, w)
	l.mu.Unlock()
	<-gathered
	l.admit()
	asked := time.Now()
	<-w.admit
	// go test counts the wait in the test's time: say how much of it it was.
	if waited := time.Since(asked); waited > time.Second {
		t.Logf("waited %s for its lane", waited.Round(time.Second))
	}
	// Registered first, so it runs after every cleanup the test adds: the
	// next test starts once this one's namespaces and processes are gone.
	t.Cleanup(func() {
		l.mu.Lock()
		l.free++
		l.mu.Unlock()
		l.admit()
	})
}

// admit lets in the best-ranked waiting tests while the lane has room.
func (l *lane) admit() {
	l.mu.Lock()
	defer l.mu.Unlock()
	for l.free > 0 && len(l.waiting) > 0 {
		best := 0
		for i, w := range l.waiting {
			if w.rank < l.waiting[best].rank {
				best = i
			}
		}
		close(l.waiting[best].admit)
		l.waiting = slices.Delete(l.waiting, best, best+1)
		l.free--
	}
}
