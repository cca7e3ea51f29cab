package daemon

import (
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
)

// ownStateFiles are the names twill keeps in --state-dir: the VTEP MACs,
// the WireGuard key, twill-wg's sockets with their PID files and logs, the
// ENI pool and atomicfile's temporaries. A directory holding only these is
// twill's alone.
var ownStateFiles = []string{"vxlan-*.mac", "wireguard.key", "*.sock", "*.sock.pid", "*.sock.log", "eni-pool", ".*.tmp*"}

// privateDir makes the state directory (keys, the VTEP MAC) 0700 when it
// creates it. An existing one looser than that (a hostPath's
// DirectoryOrCreate makes 0755) is tightened only when it holds nothing
// but twill's own files: an operator who pointed --state-dir at a shared
// directory keeps its mode, and is told. Empty dir: none.
func privateDir(dir string, log *slog.Logger) error {
	if dir == "" {
		return nil
	}
	fi, err := os.Stat(dir)
	if errors.Is(err, fs.ErrNotExist) {
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return fmt.Errorf("creating --state-dir %s: %w", dir, err)
		}
		// MkdirAll's mode passes through the umask; ours is the mode.
		if err := os.Chmod(dir, 0o700); err != nil {
			return fmt.Errorf("creating --state-dir %s: %w", dir, err)
		}
		return nil
	}
	if err != nil {
		return fmt.Errorf("reading --state-dir %s: %w", dir, err)
	}
	if !fi.IsDir() {
		return fmt.Errorf("--state-dir %s: not a directory (mode %s)", dir, fi.Mode())
	}
	mode := fi.Mode().Perm()
	if mode&0o077 == 0 {
		return nil
	}
	if foreign, err := foreignEntry(dir); err != nil {
		return fmt.Errorf("reading --state-dir %s: %w", dir, err)
	} else if foreign != "" {
		log.Warn("--state-dir holds files that are not twill's; leaving its mode alone, so others may read twill's keys",
			"state_dir", dir, "mode", fmt.Sprintf("%#o", mode), "foreign_file", foreign)
		return nil
	}
	if err := os.Chmod(dir, 0o700); err != nil {
		return fmt.Errorf("tightening --state-dir %s to 0700: %w", dir, err)
	}
	log.Info("--state-dir tightened to 0700", "state_dir", dir, "was", fmt.Sprintf("%#o", mode))
	return nil
}

// foreignEntry names the first entry of dir that is not one of twill's
// own state files, or "" when there is none.
func foreignEntry(dir string) (string, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return "", err
	}
	for _, e := range entries {
		if !ownStateFile(e.Name()) {
			return e.Name(), nil
		}
	}
	return "", nil
}

func ownStateFile(name string) bool {
	for _, pattern := range ownStateFiles {
		if ok, _ := filepath.Match(pattern, name); ok {
			return true
		}
	}
	return false
}
