package daemon

import (
	"context"

	"github.com/twill-net/twill/network"
	"github.com/twill-net/twill/nl"
)

// Kernel is what the daemon needs of the node's kernel: the backends' seam
// (nl.Kernel), the lookups that choose the external interface, the watches
// that follow it, and whether a link exists (the plugin's leaked
// addresses). twilld passes its *nl.Handle; tests without root pass
// nlfake.Kernel.
type Kernel interface {
	nl.Kernel
	network.IfaceKernel
	LinkExists(name string) (bool, error)
	WatchLinks(ctx context.Context, subscribed func(), fn func(nl.LinkEvent)) error
	WatchAddrs(ctx context.Context, subscribed func(), fn func(nl.AddrEvent)) error
}

var _ Kernel = (*nl.Handle)(nil)
