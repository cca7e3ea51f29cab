package backendtest

import (
	"io"
	"log/slog"
	"os"
	"testing"
)

// testLogger discards the backend's log unless TWILL_TEST_DEBUG is set.
func testLogger(testing.TB) *slog.Logger {
	var w io.Writer = io.Discard
	if os.Getenv("TWILL_TEST_DEBUG") != "" {
		w = os.Stderr
	}
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: slog.LevelDebug}))
}
