// Package desiredfile keeps a file's content as desired state, the way
// twill keeps a route: written atomically, and written again within moments
// whenever it is deleted, replaced or altered (or its directory removed). A
// file the CNI plugin or the container runtime reads (subnet.env, the
// conflist) must not stay missing until the daemon restarts.
//
// An inotify watch on the file's directory signals; one goroutine compares
// the file with the desired content and rewrites it. A slow periodic check
// covers what the watch cannot see (the directory re-created, a watch lost).
package desiredfile

import (
	"bytes"
	"context"
	"errors"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/twill-net/twill/internal/atomicfile"
)

// DefaultCheck is the period of the backstop check.
const DefaultCheck = 10 * time.Second

// Keeper keeps one file. Path and Logger are required.
type Keeper struct {
	Path   string
	Perm   os.FileMode // default 0644
	Logger *slog.Logger
	// Check is the backstop period (default DefaultCheck).
	Check time.Duration
	// Repaired, when set, is called after each rewrite of a file that had
	// drifted (not after Set).
	Repaired func()

	poke chan struct{}

	mu   sync.Mutex
	data []byte // guarded by mu; nil until Set
}

// Set makes data the desired content and writes it now.
func (k *Keeper) Set(data []byte) error {
	k.mu.Lock()
	k.data = bytes.Clone(data)
	k.mu.Unlock()
	_, err := k.sync()
	return err
}

// sync rewrites the file when it differs from the desired content, and
// reports whether it did.
func (k *Keeper) sync() (bool, error) {
	k.mu.Lock()
	want := k.data
	k.mu.Unlock()
	if want == nil {
		return false, nil
	}
	have, err := os.ReadFile(k.Path)
	if err == nil && bytes.Equal(have, want) {
		return false, nil
	}
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		k.Logger.Warn("reading a file twill keeps; rewriting it", "path", k.Path, "err", err)
	}
	perm := k.Perm
	if perm == 0 {
		perm = 0o644
	}
	return true, atomicfile.Write(k.Path, want, perm)
}

// Run keeps the file as desired until ctx is done. A failed write is
// logged and retried at the next signal or check; it does not stop Run.
func (k *Keeper) Run(ctx context.Context) error {
	k.poke = make(chan struct{}, 1)
	every := k.Check
	if every <= 0 {
		every = DefaultCheck
	}
	tick := time.NewTicker(every)
	defer tick.Stop()
	go k.watchLoop(ctx)
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-k.poke:
		case <-tick.C:
		}
		repaired, err := k.sync()
		switch {
		case err != nil:
			k.Logger.Warn("could not restore a file twill keeps", "path", k.Path, "err", err)
		case repaired:
			k.Logger.Info("file was deleted or altered; wrote it again", "path", k.Path)
			if k.Repaired != nil {
				k.Repaired()
			}
		}
	}
}

// watchLoop keeps an inotify watch on the file's directory, and checks the
// file whenever the watch reports or ends (the directory removed, say).
func (k *Keeper) watchLoop(ctx context.Context) {
	for ctx.Err() == nil {
		err := k.watch(ctx)
		k.signal()
		if err != nil && ctx.Err() == nil {
			k.Logger.Debug("file watch ended; watching again", "path", k.Path, "err", err)
		}
		t := time.NewTimer(200 * time.Millisecond)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}

func (k *Keeper) signal() {
	select {
	case k.poke <- struct{}{}:
	default:
	}
}

// dirOf is the directory to watch: the file's, or its nearest existing
// ancestor when the directory itself is gone.
func (k *Keeper) dirOf() string {
	d := filepath.Dir(k.Path)
	for {
		if st, err := os.Stat(d); err == nil && st.IsDir() {
			return d
		}
		parent := filepath.Dir(d)
		if parent == d {
			return d
		}
		d = parent
	}
}
