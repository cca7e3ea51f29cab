package runlock

import (
	"context"
	"errors"
	"path/filepath"
	"testing"
	"time"
)

// A cleanup waits while a twilld holds the lock, and goes on once it is
// released; two twillds hold it at once; a twilld does not start under a
// running cleanup.
func TestWaitFree(t *testing.T) {
	path := Path(filepath.Join(t.TempDir(), "run", "subnet.env"))
	d1, err := Hold(path)
	if err != nil {
		t.Fatal(err)
	}
	d2, err := Hold(path)
	if err != nil {
		t.Fatalf("a second twilld: %v", err)
	}
	if _, err := WaitFree(context.Background(), path, 300*time.Millisecond); !errors.Is(err, ErrRunning) {
		t.Fatalf("cleanup while two twillds run: %v, want ErrRunning", err)
	}
	d1()
	done := make(chan error, 1)
	go func() {
		release, err := WaitFree(context.Background(), path, 10*time.Second)
		if err == nil {
			if _, herr := Hold(path); herr == nil {
				err = errors.New("a twilld took the lock under a cleanup")
			}
			release()
		}
		done <- err
	}()
	select {
	case err := <-done:
		t.Fatalf("cleanup went on while a twilld ran: %v", err)
	case <-time.After(300 * time.Millisecond):
	}
	d2()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("cleanup still waiting after the last twilld stopped")
	}
}
