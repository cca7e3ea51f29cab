package backoff

import (
	"context"
	"testing"
	"time"
)

// The delay doubles from Min to Max and starts again at Min after Reset.
func TestNext(t *testing.T) {
	b := Backoff{Min: 100 * time.Millisecond, Max: time.Second}
	var got []time.Duration
	for range 6 {
		got = append(got, b.Next())
	}
	want := []time.Duration{100, 200, 400, 800, 1000, 1000}
	for i := range want {
		if got[i] != want[i]*time.Millisecond {
			t.Fatalf("delays %v, want %v ms", got, want)
		}
	}
	b.Reset()
	if d := b.Next(); d != 100*time.Millisecond {
		t.Errorf("after Reset: %s, want 100ms", d)
	}
}

// Sleep returns false at once when its context is done.
func TestSleepCanceled(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	start := time.Now()
	if Sleep(ctx, time.Hour) {
		t.Fatal("Sleep on a canceled context reported it waited")
	}
	if time.Since(start) > time.Minute {
		t.Fatal("Sleep on a canceled context waited")
	}
	if !Sleep(context.Background(), time.Millisecond) {
		t.Fatal("Sleep of 1ms did not report it waited")
	}
}
