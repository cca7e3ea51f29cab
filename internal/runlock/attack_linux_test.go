package runlock

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// A local user cannot keep twilld from starting: as nobody, flock(1)
// tries to take the lock exclusively (which needs only a file it can
// open), on a lock file twilld created and on one an older twilld left
// readable by all; twilld then starts.
func TestPrivilegedLocalUserCannotTakeTheLock(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root, to try the lock as another user (make test runs it as root)")
	}
	for _, tc := range []struct {
		name string
		// prep leaves the lock file as the case has it.
		prep func(path string) error
	}{
		{"the file twilld creates", func(string) error { return nil }},
		{"a file an older twilld left 0644", func(path string) error {
			return os.WriteFile(path, nil, 0o644)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir, err := os.MkdirTemp("", "runlock-attack-")
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { os.RemoveAll(dir) })
			if err := os.Chmod(dir, 0o755); err != nil { // as /run/twill is
				t.Fatal(err)
			}
			path := filepath.Join(dir, "twilld.lock")
			if err := tc.prep(path); err != nil {
				t.Fatal(err)
			}
			// twilld starts once on it (a first start, or an update), then
			// stops.
			release, err := Hold(path)
			if err != nil {
				t.Fatal(err)
			}
			release()
			held := takeAsNobody(t, path)
			release, err = Hold(path)
			if err != nil {
				t.Fatalf("twilld cannot start once nobody tried the lock (nobody: %s): %v", held, err)
			}
			release()
			if held == "held" {
				t.Fatal("nobody took the lock (twilld started only because the lock was shared)")
			}
		})
	}
}

// takeAsNobody runs flock(1) as nobody on path, holding the lock for as
// long as the test runs if it gets it, and says what came of it: "held",
// or flock's error.
func takeAsNobody(t *testing.T, path string) string {
	t.Helper()
	cmd := exec.Command("flock", "--exclusive", "--nonblock", path, "sh", "-c", "echo held; exec sleep 60")
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}, Setpgid: true}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	// flock, and the shell and sleep it runs: a group of their own.
	t.Cleanup(func() { syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL); cmd.Wait() })
	line := make(chan string, 1)
	go func() {
		s := bufio.NewScanner(out)
		s.Scan()
		line <- s.Text()
	}()
	select {
	case l := <-line:
		if l == "held" {
			return l
		}
		cmd.Wait()
		return strings.TrimSpace(stderr.String())
	case <-time.After(10 * time.Second):
		t.Fatal("flock as nobody neither took the lock nor failed within 10s")
	}
	return ""
}
