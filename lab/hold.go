package lab

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/netip"
	"sync"
	"time"
)

// The disruption harness: what users hold, held through an event. From
// one vantage point, to each target's echo server, it keeps
//   - a long-lived TCP connection sending a heartbeat every HoldBeat and
//     checking its echo: a reset, a close or a stall over HoldStall breaks
//     it (and it is made again);
//   - a stream of new TCP connections, one every HoldBeat*2;
//   - a UDP echo every HoldBeat*2,
// and writes, every second, one HoldWindow per target.

// HoldBeat is the heartbeat of a held connection; HoldStall is the longest
// it may go without an echo before it counts as broken.
const (
	HoldBeat  = 100 * time.Millisecond
	HoldStall = time.Second
)

// HoldMarker opens every heartbeat and UDP echo: a capture looks for it
// in clear.
const HoldMarker = "twill-hold-marker"

// HoldWindow is one second of one target, as seen from one vantage point.
type HoldWindow struct {
	At     time.Time `json:"at"` // the window's end
	Target string    `json:"target"`
	// Broken counts the held connections that broke in the window (reset,
	// closed, or stalled over HoldStall); Errors says how.
	Broken int      `json:"broken,omitempty"`
	Errors []string `json:"errors,omitempty"`
	// StallMs is the longest time without an echo on the held connection
	// that ended in the window, or is still going at its end.
	StallMs int64 `json:"stallMs"`
	NewOK   int   `json:"newOK"`
	NewFail int   `json:"newFail,omitempty"`
	// NewGapMs is the longest time between two new connections that got
	// through, ending in the window (or still going at its end).
	NewGapMs int64 `json:"newGapMs"`
	UDPOK    int   `json:"udpOK"`
	UDPLost  int   `json:"udpLost,omitempty"`
}

// holdStats gathers one target's window; mu guards it.
type holdStats struct {
	mu                   sync.Mutex
	w                    HoldWindow
	lastEcho, lastNew    time.Time
	stallEnded, gapEnded time.Duration
}

func (h *holdStats) echoed(now time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	lengthen(&h.stallEnded, &h.lastEcho, now)
}

// lengthen makes longest the longest time between two events, now's and
// the last's, and now the last.
func lengthen(longest *time.Duration, last *time.Time, now time.Time) {
	if d := now.Sub(*last); d > *longest {
		*longest = d
	}
	*last = now
}

func (h *holdStats) broke(err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.w.Broken++
	if len(h.w.Errors) < 4 {
		h.w.Errors = append(h.w.Errors, err.Error())
	}
}

// newConn records a new connection started at start, in the order they
// started: the gap is measured between the starts of connections that got
// through.
func (h *holdStats) newConn(ok bool, start time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if !ok {
		h.w.NewFail++
		return
	}
	h.w.NewOK++
	if start.After(h.lastNew) {
		lengthen(&h.gapEnded, &h.lastNew, start)
	}
}

func (h *holdStats) udp(ok bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if ok {
		h.w.UDPOK++
	} else {
		h.w.UDPLost++
	}
}

// take ends the window at now and starts the next.
func (h *holdStats) take(now time.Time) HoldWindow {
	h.mu.Lock()
	defer h.mu.Unlock()
	w := h.w
	w.At = now
	w.StallMs = max(h.stallEnded, now.Sub(h.lastEcho)).Milliseconds()
	w.NewGapMs = max(h.gapEnded, now.Sub(h.lastNew)).Milliseconds()
	h.w = HoldWindow{Target: w.Target}
	h.stallEnded, h.gapEnded = 0, 0
	return w
}

// Hold holds connections to every target until ctx is done, writing a
// JSON HoldWindow per target every second to out.
func Hold(ctx context.Context, targets []netip.AddrPort, out io.Writer) error {
	start := time.Now()
	stats := make([]*holdStats, len(targets))
	var wg sync.WaitGroup
	for i, t := range targets {
		h := &holdStats{w: HoldWindow{Target: t.String()}, lastEcho: start, lastNew: start}
		stats[i] = h
		wg.Add(3)
		go func() { defer wg.Done(); holdConn(ctx, t, h) }()
		go func() { defer wg.Done(); newConns(ctx, t, h) }()
		go func() { defer wg.Done(); udpEchoes(ctx, t, h) }()
	}
	enc := json.NewEncoder(out)
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	var err error
	for done := false; !done; {
		select {
		case <-ctx.Done():
			done = true
		case <-tick.C:
		}
		now := time.Now()
		for _, h := range stats {
			if e := enc.Encode(h.take(now)); e != nil && err == nil {
				err = e
			}
		}
	}
	wg.Wait()
	return err
}

// holdConn keeps one connection to t, a heartbeat every HoldBeat, until
// ctx is done; a broken one is counted and made again.
func holdConn(ctx context.Context, t netip.AddrPort, h *holdStats) {
	for ctx.Err() == nil {
		c, err := net.DialTimeout("tcp", t.String(), HoldStall)
		if err != nil {
			sleepCtx(ctx, HoldBeat)
			continue
		}
		h.echoed(time.Now()) // a new connection starts its own clock
		err = heartbeat(ctx, c, h)
		c.Close()
		if err != nil && ctx.Err() == nil {
			h.broke(err)
		}
	}
}

// heartbeat sends a line every HoldBeat and reads its echo, until ctx is
// done (nil) or the connection fails.
func heartbeat(ctx context.Context, c net.Conn, h *holdStats) error {
	r := bufio.NewReader(c)
	for seq := 0; ctx.Err() == nil; seq++ {
		line := fmt.Sprintf("%s hb %d\n", HoldMarker, seq)
		_ = c.SetDeadline(time.Now().Add(HoldStall))
		if _, err := io.WriteString(c, line); err != nil {
			return err
		}
		got, err := r.ReadString('\n')
		if err != nil {
			return err
		}
		if got != line {
			return fmt.Errorf("echo %q, want %q", got, line)
		}
		h.echoed(time.Now())
		sleepCtx(ctx, HoldBeat)
	}
	return nil
}

// newConns starts a new connection to t every 2*HoldBeat, whether or not
// those before it have answered (each may take up to HoldStall), until ctx
// is done, and records them in the order they started. The gap between two
// that got through is then how long new connections failed, not one failed
// attempt's timeout: a lost SYN, which TCP sends again only after a second,
// costs one attempt.
func newConns(ctx context.Context, t netip.AddrPort, h *holdStats) {
	type attempt struct {
		start time.Time
		ok    chan bool
	}
	inFlight := make(chan attempt, int(HoldStall/(2*HoldBeat))+2)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for a := range inFlight {
			if ok := <-a.ok; ctx.Err() == nil {
				h.newConn(ok, a.start)
			}
		}
	}()
	tick := time.NewTicker(2 * HoldBeat)
	defer tick.Stop()
	for ctx.Err() == nil {
		a := attempt{start: time.Now(), ok: make(chan bool, 1)}
		inFlight <- a
		go func() { a.ok <- probeOne(t.String(), 0, HoldStall) == "" }()
		select {
		case <-ctx.Done():
		case <-tick.C:
		}
	}
	close(inFlight)
	<-done
}

func udpEchoes(ctx context.Context, t netip.AddrPort, h *holdStats) {
	c, err := net.Dial("udp", t.String())
	if err != nil {
		return
	}
	defer c.Close()
	buf := make([]byte, 64)
	for seq := 0; ctx.Err() == nil; seq++ {
		msg := fmt.Sprintf("%s udp %d", HoldMarker, seq)
		_ = c.SetDeadline(time.Now().Add(HoldStall))
		ok := false
		if _, err := c.Write([]byte(msg)); err == nil {
			for { // skip late echoes of earlier datagrams
				n, err := c.Read(buf)
				if err != nil {
					break
				}
				if string(buf[:n]) == msg {
					ok = true
					break
				}
			}
		}
		if ctx.Err() != nil {
			return
		}
		h.udp(ok)
		sleepCtx(ctx, 2*HoldBeat)
	}
}

func sleepCtx(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}
