// Package runlock says whether a twilld runs on the node: twilld holds a
// shared lock on a file beside its subnet.env for as long as it runs, and
// twilld cleanup takes it exclusively, waiting for a twilld that is still
// stopping. Without it, a cleanup that overlaps a twilld (a rollback whose
// next network agent starts while twill's pod terminates) would be undone
// by twilld's drift repair.
package runlock

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"time"
)

// Path is the lock file for a twilld whose subnet.env is subnetFile.
func Path(subnetFile string) string { return filepath.Join(filepath.Dir(subnetFile), "twilld.lock") }

// Hold takes the shared lock a running twilld holds, creating the file
// (and its directory) if needed; release gives it back. Several twillds
// may hold it at once (two pods of a rolling update).
func Hold(path string) (release func(), err error) {
	f, err := open(path)
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_SH|syscall.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, fmt.Errorf("%s: twilld cleanup is running on this node: %w", path, err)
		}
		return nil, fmt.Errorf("locking %s: %w", path, err)
	}
	return func() { f.Close() }, nil
}

// ErrRunning is WaitFree's error when a twilld still holds the lock.
var ErrRunning = errors.New("twilld still runs on this node")

// WaitFree takes the lock exclusively, polling until no twilld holds it,
// for at most wait (or until ctx is done); release gives it back.
func WaitFree(ctx context.Context, path string, wait time.Duration) (release func(), err error) {
	f, err := open(path)
	if err != nil {
		return nil, err
	}
	deadline := time.Now().Add(wait)
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		switch {
		case err == nil:
			return func() { f.Close() }, nil
		case !errors.Is(err, syscall.EWOULDBLOCK):
			f.Close()
			return nil, fmt.Errorf("locking %s: %w", path, err)
		case time.Now().After(deadline):
			f.Close()
			return nil, fmt.Errorf("%w (it holds %s) after waiting %s: stop it first", ErrRunning, path, wait)
		}
		select {
		case <-ctx.Done():
			f.Close()
			return nil, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func open(path string) (*os.File, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, fmt.Errorf("creating %s's directory: %w", path, err)
	}
	// The owner's alone: flock needs only a file one can open, so a lock
	// any user could read is one any user could take, and keep every
	// twilld from starting. A file an older twilld created readable by
	// all is made the owner's too.
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("opening %s: %w", path, err)
	}
	st, err := f.Stat()
	if err == nil && st.Mode().Perm()&0o077 != 0 {
		err = f.Chmod(0o600)
	}
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("making %s its owner's alone: %w", path, err)
	}
	return f, nil
}
