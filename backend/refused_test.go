package backend

import (
	"bytes"
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
	many := make([]string, 9)
	for i := range many {
		many[i] = "10.244." + string(rune('1'+i)) + ".0/24: x"
	}
	r.Report(many)
	if last := buf.String()[strings.LastIndex(buf.String(), "refusing"):]; strings.Count(last, ": x") != 5 || !strings.Contains(last, "count=9") {
		t.Errorf("a long set should show 5 peers and the count 9: %s", last)
	}
}
