package app

import (
	"os"
	"strings"
	"testing"
)

// rotate-key signals only a twilld: never a process that is something else.
func TestRotateKeyRefusesOtherProcesses(t *testing.T) {
	err := signalTwilld(os.Getpid())
	if err == nil || !strings.Contains(err.Error(), "not twilld") {
		t.Fatalf("signalling this test binary: %v", err)
	}
	if err := signalTwilld(1 << 30); err == nil {
		t.Fatal("signalling a PID that does not exist succeeded")
	}
}
