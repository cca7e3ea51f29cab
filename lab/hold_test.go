package lab

import (
	"testing"
	"time"
)

// The new-connection gap runs between the starts of connections that got
// through: a failed attempt's timeout is not part of it.
func TestNewConnGap(t *testing.T) {
	t0 := time.Now()
	h := &holdStats{lastNew: t0}
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	h.newConn(true, at(200))
	h.newConn(false, at(400))
	h.newConn(false, at(600))
	h.newConn(true, at(800))
	h.newConn(true, at(1000))
	w := h.take(at(1100))
	if w.NewOK != 3 || w.NewFail != 2 {
		t.Errorf("%d ok, %d failed; want 3 and 2", w.NewOK, w.NewFail)
	}
	if w.NewGapMs != 600 {
		t.Errorf("gap %d ms, want 600 (from the start at 200 to the one at 800)", w.NewGapMs)
	}
}
