// Package cni is the eni backend's contract with the twill CNI plugin: the
// subnet.env keys it writes and the warm-pool directory both use. It is
// small on purpose, so the plugin links none of the daemon's code.
package cni

import (
	"errors"
	"net/netip"
	"os"
	"path/filepath"

	"github.com/twill-net/twill/internal/atomicfile"
)

// Modes.
const (
	ModePrefix      = "prefix"
	ModeSecondaryIP = "secondary-ip"
)

// subnet.env keys (after TWILL_).
const (
	EnvMode         = "ENI_MODE"
	EnvTable        = "ENI_TABLE"
	EnvRuleToPod    = "ENI_RULE_TO_POD"
	EnvRuleFromPod  = "ENI_RULE_FROM_POD"
	EnvPoolDir      = "ENI_POOL"
	EnvENIInterface = "ENI_INTERFACE"
)

// The warm pool directory (subnet.env's TWILL_ENI_POOL), shared by twilld
// and the CNI plugin:
//
//	<dir>/pool.json   the ENI's secondary IPs pods may take, written by twilld
//	<dir>/eni/<ip>    one file per IP in use, host-local's layout, written by the plugin
//	<dir>/eni/lock    the lock both take (host-local's)
//
// The plugin reserves an IP listed in pool.json while holding the lock;
// twilld removes an IP from pool.json under the same lock before it asks the
// provider to release it, so an IP is never handed to a pod and released at
// once.

// PoolStoreName is the host-local network name of the pool's store.
const PoolStoreName = "eni"

// PoolFile is pool.json.
type PoolFile struct {
	ENI string
	IPs []netip.Addr
	// Exhausted says why the pool cannot grow (the ENI's limit, the subnet
	// full); empty while it can. The plugin fails at once with it when no
	// IP is free, instead of waiting.
	Exhausted string `json:",omitempty"`
}

// ReadPoolFile reads <dir>/pool.json.
func ReadPoolFile(dir string) (PoolFile, error) {
	var p PoolFile
	err := atomicfile.ReadJSON(filepath.Join(dir, "pool.json"), &p)
	return p, err
}

// WritePoolFile replaces <dir>/pool.json atomically.
func WritePoolFile(dir string, p PoolFile) error {
	return atomicfile.WriteJSON(filepath.Join(dir, "pool.json"), p, 0o644)
}

// PoolInUse lists the IPs reserved in the pool's store.
func PoolInUse(dir string) (map[netip.Addr]bool, error) {
	ents, err := os.ReadDir(filepath.Join(dir, PoolStoreName))
	if errors.Is(err, os.ErrNotExist) {
		return map[netip.Addr]bool{}, nil
	}
	if err != nil {
		return nil, err
	}
	used := map[netip.Addr]bool{}
	for _, e := range ents {
		if ip, err := netip.ParseAddr(e.Name()); err == nil {
			used[ip] = true
		}
	}
	return used, nil
}
