package daemon

import (
	"bytes"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestPrivateDir(t *testing.T) {
	for _, tc := range []struct {
		name    string
		exists  bool
		files   []string
		mode    os.FileMode
		want    os.FileMode
		wantLog string
	}{
		{name: "created 0700", want: 0o700},
		{name: "empty and loose is tightened", exists: true, mode: 0o755, want: 0o700, wantLog: "tightened"},
		{name: "twill's own files only is tightened", exists: true, files: []string{"vxlan-1.mac", "wireguard.key", "twill-wg-keeper.sock", "twill-wg.sock", "twill-wg.sock.pid", "twill-wg.sock.log", "eni-pool", ".wireguard.key.tmp123"},
			mode: 0o755, want: 0o700, wantLog: "tightened"},
		{name: "a shared directory keeps its mode", exists: true, files: []string{"vxlan-1.mac", "someone-elses.db"}, mode: 0o755, want: 0o755,
			wantLog: `mode=0755 foreign_file=someone-elses.db`},
		{name: "already private is left alone", exists: true, files: []string{"someone-elses.db"}, mode: 0o700, want: 0o700},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "state")
			if tc.exists {
				if err := os.Mkdir(dir, 0o700); err != nil {
					t.Fatal(err)
				}
				for _, f := range tc.files {
					if err := os.WriteFile(filepath.Join(dir, f), nil, 0o600); err != nil {
						t.Fatal(err)
					}
				}
				if err := os.Chmod(dir, tc.mode); err != nil {
					t.Fatal(err)
				}
			}
			var logs bytes.Buffer
			if err := privateDir(dir, slog.New(slog.NewTextHandler(&logs, nil))); err != nil {
				t.Fatal(err)
			}
			fi, err := os.Stat(dir)
			if err != nil {
				t.Fatal(err)
			}
			if got := fi.Mode().Perm(); got != tc.want {
				t.Errorf("mode %#o, want %#o", got, tc.want)
			}
			if !strings.Contains(logs.String(), tc.wantLog) {
				t.Errorf("log %q does not say %q", logs.String(), tc.wantLog)
			}
		})
	}
}

func TestPrivateDirRefusesAFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state")
	if err := os.WriteFile(path, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	err := privateDir(path, slog.New(slog.DiscardHandler))
	if err == nil || !strings.Contains(err.Error(), "--state-dir "+path) {
		t.Fatalf("privateDir on a file: %v, want an error naming --state-dir %s", err, path)
	}
}
