package backend

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"

	"github.com/twill-net/twill/subnet"
)

// Factory builds a backend for this node. It decodes opts.Config.Backend and
// rejects unknown keys; it must not touch the kernel (Prepare does).
type Factory func(opts Options) (Backend, error)

// Registry maps backend type names to factories. The zero value is empty and
// ready to use; it is safe for concurrent use.
type Registry struct {
	factories Named[Factory]
}

// Register adds a factory under name. It panics on an empty name, a nil
// factory or a name already taken: these are programming errors found at
// start-up, not conditions to handle.
func (r *Registry) Register(name string, f Factory) {
	if f == nil {
		panic(fmt.Sprintf("backend: Register %q with a nil factory", name))
	}

	r.factories.Add(name, f)
}

// Names lists the registered backend names, sorted.
func (r *Registry) Names() []string { return r.factories.Names() }

// ErrUnknown is returned (wrapped) by New for a name nobody registered.
var ErrUnknown = errors.New("unknown backend type")

// New builds the backend registered under name.
func (r *Registry) New(name string, opts Options) (Backend, error) {
	f, ok := r.factories.Get(name)
	if !ok {
		return nil, fmt.Errorf("net-conf.json: Backend.Type %q: %w (registered: %s)", name, ErrUnknown, strings.Join(r.Names(), ", "))
	}
	b, err := f(opts)
	if err != nil {
		return nil, fmt.Errorf("creating %s backend: %w", name, err)
	}
	return b, nil
}

// Default is the registry that init() functions register into and that
// twilld's main hands to the daemon. Tests build their own Registry.
var Default = &Registry{}

// Register adds a factory to the Default registry; call it from init().
func Register(name string, f Factory) { Default.Register(name, f) }

// Check validates cfg's backend configuration the way twilld will, without
// touching anything on this machine: the type must be registered, and its
// factory must accept the Backend object (strict decoding, value ranges).
// twillctl config put runs it before storing a configuration.
func (r *Registry) Check(cfg *subnet.Config) error {
	opts := Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Config: cfg, CheckOnly: true}
	_, err := r.New(cfg.BackendType, opts)
	return err
}
