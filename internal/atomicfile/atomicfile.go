// Package atomicfile writes files so that readers see the old content or
// the new, never a part of either, and so that a crash right after a write
// leaves the new content on disk: the data goes to a temporary file in the
// same directory, is synced, renamed over the target, and the directory is
// synced. It is the one way twill writes a file others read (subnet.env,
// the CNI conflist and plugin, pool and state files).
package atomicfile

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
)

// Write replaces path with data, creating its directory if needed.
func Write(path string, data []byte, perm os.FileMode) error {
	return WriteFrom(path, func(w io.Writer) error { _, err := w.Write(data); return err }, perm)
}

// WriteFrom is Write with the content produced by fill.
func WriteFrom(path string, fill func(io.Writer) error, perm os.FileMode) (err error) {
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	f, err := os.CreateTemp(dir, "."+filepath.Base(path)+".tmp*")
	if err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	tmp := f.Name()
	defer func() {
		if err != nil {
			f.Close()
			os.Remove(tmp)
		}
	}()
	if err := fill(f); err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	if err := f.Chmod(perm); err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	if err := f.Sync(); err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	// The rename is durable once the directory is.
	if d, err := os.Open(dir); err == nil {
		_ = d.Sync()
		d.Close()
	}
	return nil
}

// WriteJSON replaces path with v as indented JSON and a final newline.
func WriteJSON(path string, v any, perm os.FileMode) error {
	data, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	return Write(path, append(data, '\n'), perm)
}

// ReadJSON decodes the JSON document in path into v. An error reading the
// file is returned as it is (errors.Is(err, fs.ErrNotExist) holds for a
// missing one); a decoding error names the path.
func ReadJSON(path string, v any) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	if err := json.Unmarshal(data, v); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	return nil
}
