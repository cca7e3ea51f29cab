package gcpace

import (
	"runtime"
	"runtime/debug"
	"sync"
	"testing"
	"time"
)

// recorder is the GC percent as the runtime would hold it.
type recorder struct {
	mu      sync.Mutex
	percent int
}

func (r *recorder) set(p int) { r.mu.Lock(); r.percent = p; r.mu.Unlock() }
func (r *recorder) get() int  { r.mu.Lock(); defer r.mu.Unlock(); return r.percent }

// waitPercent runs collections until the percent is want (finalizers run
// on their own goroutine after the cycle).
func waitPercent(t *testing.T, r *recorder, want int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for r.get() != want {
		if time.Now().After(deadline) {
			t.Fatalf("GC percent %d, want %d", r.get(), want)
		}
		runtime.GC()
		time.Sleep(time.Millisecond)
	}
}

func TestPhases(t *testing.T) {
	r := &recorder{percent: 100}
	p := Start(r.set)
	if got := r.get(); got != First {
		t.Fatalf("after Start: %d%%, want %d%%", got, First)
	}
	waitPercent(t, r, Startup)
	p.StartedUp()
	if got := r.get(); got != Steady {
		t.Fatalf("after StartedUp: %d%%, want %d%%", got, Steady)
	}
}

// A node ready before its first collection goes straight to Steady and
// stays there when the collection comes.
func TestReadyBeforeFirstGC(t *testing.T) {
	r := &recorder{percent: 100}
	p := Start(r.set)
	p.StartedUp()
	finalizersRun(t)
	if got := r.get(); got != Steady {
		t.Fatalf("after StartedUp and collections: %d%%, want %d%%", got, Steady)
	}
}

// finalizersRun returns once the finalizers of objects unreachable now
// have run: those of two sentinels, the second armed after the first
// ran (the finalizer goroutine runs each cycle's batch in turn).
func finalizersRun(t *testing.T) {
	t.Helper()
	for range 2 {
		done := make(chan struct{})
		afterNextGC(func() { close(done) })
		deadline := time.Now().Add(10 * time.Second)
		for ran := false; !ran; {
			runtime.GC()
			select {
			case <-done:
				ran = true
			case <-time.After(time.Millisecond):
				if time.Now().After(deadline) {
					t.Fatal("no finalizer ran within 10s")
				}
			}
		}
	}
}

// GOGC in the environment: the pacer leaves the runtime's percent alone.
func TestUnmanaged(t *testing.T) {
	before := debug.SetGCPercent(77)
	defer debug.SetGCPercent(before)
	p := Start(nil)
	p.StartedUp()
	runtime.GC()
	if got := debug.SetGCPercent(77); got != 77 {
		t.Fatalf("GC percent %d, want 77 (untouched)", got)
	}
}

// With the runtime's own setter: the percent the runtime holds follows.
func TestRuntimePercent(t *testing.T) {
	before := debug.SetGCPercent(100)
	defer debug.SetGCPercent(before)
	r := &recorder{}
	p := Start(func(pc int) { debug.SetGCPercent(pc); r.set(pc) })
	if got := debug.SetGCPercent(First); got != First {
		t.Fatalf("runtime percent %d, want %d", got, First)
	}
	waitPercent(t, r, Startup)
	if got := debug.SetGCPercent(Startup); got != Startup {
		t.Fatalf("runtime percent %d, want %d", got, Startup)
	}
	p.StartedUp()
	if got := debug.SetGCPercent(Steady); got != Steady {
		t.Fatalf("runtime percent %d, want %d", got, Steady)
	}
}

// StartedUp collects start-up's garbage itself, so that no collection is left
// to run beside the first lease events.
func TestReadyCollects(t *testing.T) {
	before := debug.SetGCPercent(100)
	defer debug.SetGCPercent(before)
	p := Start(func(pc int) { debug.SetGCPercent(pc) })
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	gcs := m.NumGC
	p.StartedUp()
	runtime.ReadMemStats(&m)
	if m.NumGC == gcs {
		t.Fatal("no collection when the node became ready")
	}
}
