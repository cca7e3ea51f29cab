package vxlan

import (
	"context"

	"golang.org/x/sync/errgroup"

	"github.com/twill-net/twill/backend"
	"github.com/twill-net/twill/backend/nl"
)

// linkWatcher follows link events (*nl.Handle).
type linkWatcher interface {
	WatchLinks(ctx context.Context, subscribed func(), fn func(nl.LinkEvent)) error
}

// WatchKernel pokes when the VTEP device changes or disappears, or when one
// of twill's routes changes behind its back. Every (re)subscription pokes,
// since events before it were not seen.
func (n *Network) WatchKernel(ctx context.Context, poke func()) error {
	lw, ok := n.b.k.(linkWatcher)
	if !ok {
		return n.routes.Watch(ctx, n.b.log, poke)
	}
	name := n.b.dev.Name
	g, ctx := errgroup.WithContext(ctx)
	g.Go(func() error {
		return backend.WatchLoop(ctx, n.b.log, "link", func() { n.routes.Invalidate(); poke() }, func(ctx context.Context, subscribed func()) error {
			return lw.WatchLinks(ctx, subscribed, func(ev nl.LinkEvent) {
				if ev.Link.Name == name {
					poke()
				}
			})
		})
	})
	g.Go(func() error { return n.routes.Watch(ctx, n.b.log, poke) })
	return g.Wait()
}
