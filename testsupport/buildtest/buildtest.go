// Package buildtest builds the project's programs (and pinned upstream
// ones) once per test process, the way `make build` does, for tests that
// run them as users would.
package buildtest

import (
	"fmt"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

// PrebuiltEnv names a directory of binaries built beforehand, which
// Binaries then returns instead of building: a test binary run where there
// is no Go toolchain (make test-kernels' virtual machines) finds twill's
// programs there.
const PrebuiltEnv = "TWILL_TEST_BIN_DIR"

var (
	mu    sync.Mutex
	built = map[string]string{} // guarded by mu; package list -> directory
	errs  = map[string]error{}  // guarded by mu
)

// Binaries builds the main packages (import paths) into one directory,
// once per distinct list in this process, and returns the directory.
func Binaries(t testing.TB, pkgs ...string) string {
	t.Helper()
	key := strings.Join(pkgs, " ")
	mu.Lock()
	defer mu.Unlock()
	if dir, ok := built[key]; ok {
		return dir
	}
	if dir := os.Getenv(PrebuiltEnv); dir != "" {
		for _, pkg := range pkgs {
			if _, err := os.Stat(filepath.Join(dir, path.Base(pkg))); err != nil {
				t.Fatalf("%s=%s lacks %s: %v", PrebuiltEnv, dir, path.Base(pkg), err)
			}
		}
		return dir
	}
	if err, ok := errs[key]; ok {
		t.Fatal(err)
	}
	dir, err := os.MkdirTemp("", "twill-test-bin")
	if err == nil {
		cmd := exec.Command("go", append([]string{"build", "-trimpath", "-ldflags", "-s -w", "-o", dir + "/"}, pkgs...)...)
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, berr := cmd.CombinedOutput(); berr != nil {
			err = fmt.Errorf("go build %s: %w: %s", key, berr, out)
			os.RemoveAll(dir)
		}
	}
	if err != nil {
		errs[key] = err
		t.Fatal(err)
	}
	built[key] = dir
	return dir
}

// Cleanup removes every directory Binaries made; call it from TestMain
// after m.Run.
func Cleanup() {
	mu.Lock()
	defer mu.Unlock()
	for k, dir := range built {
		os.RemoveAll(dir)
		delete(built, k)
	}
}
