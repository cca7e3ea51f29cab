package desiredfile

import (
	"context"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"
)

// waitContent waits (generously) until path holds want.
func waitContent(t *testing.T, path, want string) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		got, err := os.ReadFile(path)
		if err == nil && string(got) == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %q (err %v), want %q", path, got, err, want)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestKeeperRestores(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "net.d", "10-twill.conflist")
	var repairs atomic.Int32
	// The backstop check is an hour away: only the watch can repair in time.
	k := &Keeper{Path: path, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Check: time.Hour,
		Repaired: func() { repairs.Add(1) }}
	if err := k.Set([]byte("want\n")); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- k.Run(ctx) }()
	defer func() { cancel(); <-done }()
	waitContent(t, path, "want\n")
	time.Sleep(100 * time.Millisecond) // the watch is in place

	for _, c := range []struct {
		name   string
		break_ func() error
	}{
		{"deleted", func() error { return os.Remove(path) }},
		{"altered", func() error { return os.WriteFile(path, []byte("someone else's\n"), 0o644) }},
		{"replaced by rename", func() error {
			tmp := filepath.Join(filepath.Dir(path), "x")
			if err := os.WriteFile(tmp, []byte("other"), 0o644); err != nil {
				return err
			}
			return os.Rename(tmp, path)
		}},
		// Moved away first: a plain RemoveAll races with the keeper, which
		// restores the file while RemoveAll empties the directory.
		{"directory removed", func() error {
			gone := filepath.Dir(path) + ".gone"
			if err := os.Rename(filepath.Dir(path), gone); err != nil {
				return err
			}
			return os.RemoveAll(gone)
		}},
		{"directory emptied", func() error { return os.Remove(path) }},
	} {
		t.Run(c.name, func(t *testing.T) {
			before := repairs.Load()
			if err := c.break_(); err != nil {
				t.Fatal(err)
			}
			waitContent(t, path, "want\n")
			deadline := time.Now().Add(5 * time.Second)
			for repairs.Load() == before && time.Now().Before(deadline) {
				time.Sleep(10 * time.Millisecond)
			}
			if repairs.Load() == before {
				t.Error("the repair was not reported")
			}
			time.Sleep(300 * time.Millisecond) // let the watch settle again
		})
	}
}

func TestSetWritesAtomicallyWithMode(t *testing.T) {
	path := filepath.Join(t.TempDir(), "subnet.env")
	k := &Keeper{Path: path, Perm: 0o600, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
	if err := k.Set([]byte("A=1\n")); err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat(path)
	if err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("stat: %v, mode %v", err, st.Mode())
	}
	ents, _ := os.ReadDir(filepath.Dir(path))
	if len(ents) != 1 {
		t.Fatalf("temporary files left: %v", ents)
	}
}
