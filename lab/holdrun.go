package lab

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"
)

// HoldRecord is a window of one (vantage, target) pair.
type HoldRecord struct {
	From, To string // names
	HoldWindow
}

// HoldRun is lab hold running in each vantage point: its windows, as they
// come.
type HoldRun struct {
	mu      sync.Mutex
	records []HoldRecord
	errs    []error
	done    chan struct{}
}

// StartHold runs twill-lab lab hold inside each vantage's namespace, to
// every target but those at the same node (pairs says which to hold:
// nil holds every pair), until ctx is done or for d.
func StartHold(ctx context.Context, binDir string, from []Vantage, to []Target, pairs func(Vantage, Target) bool, d time.Duration) *HoldRun {
	r := &HoldRun{done: make(chan struct{})}
	names := map[string]string{}
	for _, t := range to {
		names[t.Addr.String()] = t.Name
	}
	var wg sync.WaitGroup
	for _, v := range from {
		var targets []string
		for _, t := range to {
			if pairs == nil || pairs(v, t) {
				targets = append(targets, t.Addr.String())
			}
		}
		if len(targets) == 0 {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			args := append([]string{"--net=" + v.NetNS, filepath.Join(binDir, "twill-lab"), "lab", "hold", "--for", d.String()}, targets...)
			cmd := exec.CommandContext(ctx, "nsenter", args...)
			cmd.WaitDelay = 5 * time.Second
			out, err := cmd.StdoutPipe()
			if err != nil {
				r.fail(err)
				return
			}
			var stderr strings.Builder
			cmd.Stderr = &stderr
			if err := cmd.Start(); err != nil {
				r.fail(fmt.Errorf("lab hold in %s: %w", v.Name, err))
				return
			}
			sc := bufio.NewScanner(out)
			for sc.Scan() {
				var w HoldWindow
				if err := json.Unmarshal(sc.Bytes(), &w); err != nil {
					r.fail(fmt.Errorf("lab hold in %s: %q: %w", v.Name, sc.Text(), err))
					continue
				}
				r.mu.Lock()
				r.records = append(r.records, HoldRecord{From: v.Name, To: names[w.Target], HoldWindow: w})
				r.mu.Unlock()
			}
			if err := cmd.Wait(); err != nil && ctx.Err() == nil {
				r.fail(fmt.Errorf("lab hold in %s: %w: %s", v.Name, err, stderr.String()))
			}
		}()
	}
	go func() { wg.Wait(); close(r.done) }()
	return r
}

func (r *HoldRun) fail(err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.errs = append(r.errs, err)
}

// Wait waits until every lab hold has ended, and returns their errors.
func (r *HoldRun) Wait() []error {
	<-r.done
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.errs
}

// HoldSummary is what users holding connections saw over a span.
type HoldSummary struct {
	Pairs    int
	Broken   int
	Errors   []string // of the broken connections, by pair
	Stall    time.Duration
	NewFail  int
	NewGap   time.Duration
	UDPLost  int
	UDPTotal int
}

// Summary sums the windows that ended within (from, to].
func (r *HoldRun) Summary(from, to time.Time) HoldSummary {
	r.mu.Lock()
	defer r.mu.Unlock()
	var s HoldSummary
	pairs := map[string]bool{}
	for _, rec := range r.records {
		if !rec.At.After(from) || rec.At.After(to) {
			continue
		}
		pair := rec.From + " -> " + rec.To
		pairs[pair] = true
		s.Broken += rec.Broken
		for _, e := range rec.Errors {
			s.Errors = append(s.Errors, pair+": "+e)
		}
		s.Stall = max(s.Stall, time.Duration(rec.StallMs)*time.Millisecond)
		s.NewFail += rec.NewFail
		s.NewGap = max(s.NewGap, time.Duration(rec.NewGapMs)*time.Millisecond)
		s.UDPLost += rec.UDPLost
		s.UDPTotal += rec.UDPLost + rec.UDPOK
	}
	s.Pairs = len(pairs)
	sort.Strings(s.Errors)
	return s
}

func (s HoldSummary) String() string {
	return fmt.Sprintf("%d pairs: %d broken, longest stall %s, %d new connections failed, longest new-connection gap %s, UDP %d of %d lost",
		s.Pairs, s.Broken, s.Stall.Round(time.Millisecond), s.NewFail, s.NewGap.Round(time.Millisecond), s.UDPLost, s.UDPTotal)
}
