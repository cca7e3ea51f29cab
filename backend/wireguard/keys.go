package wireguard

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"

	"github.com/twill-net/twill/internal/atomicfile"
)

// keyFile holds the node's private key in its state directory. Unlike
// flannel's, which lives on tmpfs (/run/flannel/wgkey), it survives
// reboots, so peers need not learn a new key after every one.
const keyFile = "wireguard.key"

func keyPath(stateDir string) string {
	if stateDir == "" {
		return ""
	}
	return filepath.Join(stateDir, keyFile)
}

// keyStore loads, makes and replaces the node's private key.
type keyStore struct {
	path string // "" keeps the key in memory only

	mu  sync.Mutex
	key *wgtypes.Key // guarded by mu: the key in use once loaded
}

// load returns the node's key: the one in use, else the stored one, else a
// new one, stored (0600) before it is used.
func (s *keyStore) load() (wgtypes.Key, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.key != nil {
		return *s.key, nil
	}
	if s.path != "" {
		raw, err := os.ReadFile(s.path)
		switch {
		case err == nil:
			k, err := wgtypes.ParseKey(strings.TrimSpace(string(raw)))
			if err != nil {
				return wgtypes.Key{}, fmt.Errorf("reading the WireGuard private key %s: %w (delete the file to make a new key)", s.path, err)
			}
			if err := os.Chmod(s.path, 0o600); err != nil {
				return wgtypes.Key{}, fmt.Errorf("restricting %s: %w", s.path, err)
			}
			s.key = &k
			return k, nil
		case !errors.Is(err, fs.ErrNotExist):
			return wgtypes.Key{}, fmt.Errorf("reading the WireGuard private key: %w", err)
		}
	}
	return s.newKeyLocked()
}

// peek returns the key in use, else the stored one, without making one:
// ok is false when there is none (twillctl status on a node whose twilld
// never ran).
func (s *keyStore) peek() (k wgtypes.Key, ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.key != nil {
		return *s.key, true
	}
	if s.path == "" {
		return wgtypes.Key{}, false
	}
	raw, err := os.ReadFile(s.path)
	if err != nil {
		return wgtypes.Key{}, false
	}
	k, err = wgtypes.ParseKey(strings.TrimSpace(string(raw)))
	return k, err == nil
}

// rotate replaces the key with a new one, stored before it is used.
func (s *keyStore) rotate() (wgtypes.Key, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.newKeyLocked()
}

func (s *keyStore) newKeyLocked() (wgtypes.Key, error) {
	k, err := wgtypes.GeneratePrivateKey()
	if err != nil {
		return wgtypes.Key{}, fmt.Errorf("making a WireGuard private key: %w", err)
	}
	if s.path != "" {
		if err := os.MkdirAll(filepath.Dir(s.path), 0o700); err != nil {
			return wgtypes.Key{}, fmt.Errorf("storing the WireGuard private key: %w", err)
		}
		if err := atomicfile.Write(s.path, []byte(k.String()+"\n"), 0o600); err != nil {
			return wgtypes.Key{}, fmt.Errorf("storing the WireGuard private key: %w", err)
		}
	}
	s.key = &k
	return k, nil
}
