// Package golden compares rendered output with a file under testdata/,
// rewriting the file instead when the test runs with -update.
package golden

import (
	"flag"
	"os"
	"path/filepath"
	"testing"
)

var update = flag.Bool("update", false, "rewrite golden files in testdata/ with the current output")

// Check compares got with testdata/<name>.golden.
func Check(t *testing.T, name string, got []byte) {
	t.Helper()
	path := filepath.Join("testdata", name+".golden")
	if *update {
		if err := os.MkdirAll("testdata", 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("reading %s (run the test with -update to create it): %v", path, err)
	}
	if string(want) != string(got) {
		t.Errorf("%s differs from the rendered state (run with -update if the change is intended)\n--- want\n%s\n--- got\n%s", path, want, got)
	}
}
