// Package gcpace sets how eagerly twilld collects garbage in each phase of
// its life.
//
// twilld idles almost all the time on every node, so its resident memory
// matters more than its collections: once the node's peers are
// programmed it collects at Steady percent. Start-up reads every lease
// into a heap that grows from nothing, and collecting that eagerly costs
// more than it saves: at 30% a start-up with 20,000 peers took a dozen
// collections (a quarter of its time), so until the peers are programmed
// the percent is Startup. What comes after, before the node reports
// ready, runs at Steady: the network policy table's first write, whose
// transient is twilld's largest at 10,000 pods (at Startup its peak RSS
// was 188 MiB, at Steady 162). And until
// the first collection the heap holds little more than the program and
// its connections: the runtime's smallest heap goal is 4 MB scaled by the
// percent, so at 60% it collected three times before the first thousand
// routes were written (a quarter of that start-up). Until the first
// collection the percent is First: small start-ups finish without one,
// and large ones pay at most a few megabytes once.
package gcpace

import (
	"runtime"
	"sync"
)

// The percent in each phase (see the package comment).
const (
	First   = 200
	Startup = 60
	Steady  = 30
)

type phase int

const (
	beforeFirstGC phase = iota
	starting
	ready
)

// Pacer moves the GC percent through the phases. The zero value is not
// usable; use Start.
type Pacer struct {
	mu    sync.Mutex
	phase phase
	set   func(percent int)
}

// Start sets the First percent through set (debug.SetGCPercent in twilld)
// and arms the switch to Startup at the first collection. A nil set means
// the percent is not to be managed (GOGC is set in the environment): the
// Pacer then does nothing.
func Start(set func(percent int)) *Pacer {
	p := &Pacer{set: set}
	if set == nil {
		return p
	}
	set(First)
	afterNextGC(p.firstGCDone)
	return p
}

// firstGCDone moves to Startup unless the node is ready already.
func (p *Pacer) firstGCDone() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.phase == beforeFirstGC {
		p.phase = starting
		p.set(Startup)
	}
}

// StartedUp moves to Steady for good, and collects what start-up left
// behind at once. Otherwise the lower percent sets a goal below the heap
// start-up left, and the collection that starts runs beside the first
// lease events: at 50,000 vxlan peers 65 ms of marking, with 20 ms of
// assists charged to the goroutines handling them. Called before the node
// reports ready, the collection is start-up's cost (tens of milliseconds
// at that size).
func (p *Pacer) StartedUp() {
	p.mu.Lock()
	if p.set == nil || p.phase == ready {
		p.mu.Unlock()
		return
	}
	p.phase = ready
	p.set(Steady)
	p.mu.Unlock()
	runtime.GC()
}

// afterNextGC calls f once a collection has run: the finalizer of an
// object nothing refers to runs after the cycle that finds it unreachable.
// The object holds a pointer so that it is not a tiny allocation (whose
// finalizers may never run).
func afterNextGC(f func()) {
	type sentinel struct{ p *int }
	runtime.SetFinalizer(&sentinel{p: new(int)}, func(*sentinel) { f() })
}
