package builtin

import (
	"slices"
	"testing"

	"github.com/twill-net/twill/backend"
)

// Importing the package registers every built-in backend.
func TestRegistersEveryBuiltIn(t *testing.T) {
	got := backend.Default.Names()
	for _, name := range []string{"eni", "host-gw", "vxlan", "wireguard"} {
		if !slices.Contains(got, name) {
			t.Errorf("backend %q is not registered (registered: %v)", name, got)
		}
	}
}
