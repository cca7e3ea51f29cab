package atomicfile

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestJSONRoundTrip(t *testing.T) {
	path := filepath.Join(t.TempDir(), "sub", "state.json")
	type doc struct {
		Name string
		IPs  []string
	}
	want := doc{Name: "eni-1", IPs: []string{"10.0.0.5"}}
	if err := WriteJSON(path, want, 0o640); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o640 {
		t.Errorf("mode %v, want 0640", fi.Mode().Perm())
	}
	var got doc
	if err := ReadJSON(path, &got); err != nil {
		t.Fatal(err)
	}
	if got.Name != want.Name || len(got.IPs) != 1 || got.IPs[0] != want.IPs[0] {
		t.Errorf("read back %+v, want %+v", got, want)
	}
	left, _ := filepath.Glob(filepath.Join(filepath.Dir(path), ".*tmp*"))
	if len(left) != 0 {
		t.Errorf("temporary files left: %v", left)
	}
}

func TestReadJSONErrors(t *testing.T) {
	dir := t.TempDir()
	var v map[string]any
	if err := ReadJSON(filepath.Join(dir, "missing.json"), &v); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("missing file: %v, want fs.ErrNotExist", err)
	}
	bad := filepath.Join(dir, "bad.json")
	if err := os.WriteFile(bad, []byte(`{"a":`), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := ReadJSON(bad, &v); err == nil || !strings.Contains(err.Error(), bad) {
		t.Errorf("bad JSON: %v, want an error naming %s", err, bad)
	}
}
