package backend

import (
	"fmt"
	"sort"
	"strings"
	"sync"
)

// Named is a table of plug-ins by name, filled from init(): the backends
// (Registry) and the eni backend's cloud providers. The zero value is empty
// and ready; it is safe for concurrent use. Kind names the plug-ins in the
// panics a bad registration causes ("backend" when empty); set it before
// first use.
type Named[F any] struct {
	Kind string

	mu sync.Mutex
	m  map[string]F // guarded by mu
}

// Add registers f under name. It panics on an empty name or a name already
// taken: programming errors found at start-up, not conditions to handle.
func (n *Named[F]) Add(name string, f F) {
	kind := n.Kind
	if kind == "" {
		kind = "backend"
	}
	if strings.TrimSpace(name) == "" {
		panic(fmt.Sprintf("%s registered with an empty name", kind))
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if _, dup := n.m[name]; dup {
		panic(fmt.Sprintf("%s %q registered twice", kind, name))
	}
	if n.m == nil {
		n.m = map[string]F{}
	}
	n.m[name] = f
}

// Get returns what was registered under name.
func (n *Named[F]) Get(name string) (F, bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	f, ok := n.m[name]
	return f, ok
}

// Names lists the registered names, sorted.
func (n *Named[F]) Names() []string {
	n.mu.Lock()
	defer n.mu.Unlock()
	names := make([]string, 0, len(n.m))
	for name := range n.m {
		names = append(names, name)
	}
	sort.Strings(names)
	return names
}
