package kernelsync

import (
	"bytes"
	"fmt"
	"log/slog"
	"strings"
	"testing"
)

func TestRefusedPeersLogsOncePerChange(t *testing.T) {
	var buf bytes.Buffer
	r := &RefusedPeers{Log: slog.New(slog.NewTextHandler(&buf, nil)), Message: "refusing peers"}
	lines := func() int { return strings.Count(buf.String(), "refusing peers") }

	r.Report([]string{"10.244.2.0/24: b", "10.244.1.0/24: a"})
	r.Report([]string{"10.244.1.0/24: a", "10.244.2.0/24: b"}) // same set, other order
	if lines() != 1 {
		t.Fatalf("same set twice logged %d lines, want 1:\n%s", lines(), buf.String())
	}
	if !strings.Contains(buf.String(), `peers="10.244.1.0/24: a; 10.244.2.0/24: b"`) || !strings.Contains(buf.String(), "count=2") {
		t.Errorf("line does not name the peers sorted with the count:\n%s", buf.String())
	}
	r.Report(nil) // all well again: nothing to warn about
	if lines() != 1 {
		t.Fatalf("an empty set logged a warning:\n%s", buf.String())
	}
	r.Report([]string{"10.244.1.0/24: a"})
	if lines() != 2 {
		t.Fatalf("a peer refused again after recovering was not logged:\n%s", buf.String())
	}
}

// However many peers are refused at once, each is named the first time;
// a later change names only the newcomers, and repeats name nobody.
func TestRefusedPeersNamesEveryNewcomer(t *testing.T) {
	var buf bytes.Buffer
	r := &RefusedPeers{Log: slog.New(slog.NewTextHandler(&buf, nil)), Message: "refusing peers"}
	many := make([]string, 13)
	for i := range many {
		many[i] = fmt.Sprintf("10.244.%d.0/24: x", i+1)
	}
	r.Report(many)
	for _, p := range many {
		if strings.Count(buf.String(), p) != 1 {
			t.Errorf("%q named %d times, want once:\n%s", p, strings.Count(buf.String(), p), buf.String())
		}
	}
	if !strings.Contains(buf.String(), "count=13") {
		t.Errorf("no count of 13:\n%s", buf.String())
	}
	buf.Reset()
	r.Report(append(many[1:], "10.244.99.0/24: y"))
	if got := buf.String(); strings.Count(got, ": x") != 0 || !strings.Contains(got, "10.244.99.0/24: y") || !strings.Contains(got, "count=13 new=1") {
		t.Errorf("after one peer left and one came, want only the newcomer named, with the count:\n%s", got)
	}
	buf.Reset()
	r.Report(append(many[1:], "10.244.99.0/24: y"))
	if buf.Len() != 0 {
		t.Errorf("a repeat was logged:\n%s", buf.String())
	}
}
