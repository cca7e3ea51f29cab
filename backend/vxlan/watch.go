package vxlan

import (
	"context"

	"golang.org/x/sync/errgroup"

	"github.com/twill-net/twill/backend"
	"github.com/twill-net/twill/backend/kernelsync"
	"github.com/twill-net/twill/nl"
)

// linkWatcher follows link events (*nl.Handle).
var _ backend.KernelWatcher = (*Network)(nil)

// WatchKernel pokes when the VTEP device changes or disappears, or when one
// of twill's routes, neighbour or FDB entries changes behind its back.
// Every (re)subscription checks what changed before it (deviceAsLeft, the
// syncs' Verify) and pokes if anything did; watching is called once all
// four watches have made their first check.
func (n *Network) WatchKernel(ctx context.Context, poke, watching func()) error {
	g, ctx := errgroup.WithContext(ctx)
	checked := kernelsync.AllChecked(4, watching)
	g.Go(func() error { return n.routes.Watch(ctx, n.b.log, poke, checked[0]) })
	g.Go(func() error { return n.neighs.Watch(ctx, n.b.log, poke, checked[1]) })
	g.Go(func() error { return n.fdb.Watch(ctx, n.b.log, poke, checked[2]) })
	name := n.b.dev.Name
	g.Go(func() error {
		return kernelsync.WatchLoop(ctx, n.b.log, "link", func() {
			if !n.deviceAsLeft() {
				n.b.log.Debug("the VTEP device changed before the link watch began; reconciling", "device", name)
				n.routes.Invalidate()
				poke()
			}
			checked[3]()
		}, func(ctx context.Context, subscribed func()) error {
			return n.b.k.WatchLinks(ctx, subscribed, func(ev nl.LinkEvent) {
				if ev.Link.Name == name {
					poke()
				}
			})
		})
	})
	return g.Wait()
}

// deviceAsLeft reports whether the VTEP device is the one the last
// reconcile left, up, with its offload as set: what a link watch needs to know once subscribed
// (changes after that come as events). A device altered or gone means a
// full reconcile; an intact one spares it, which matters with tens of
// thousands of peers.
func (n *Network) deviceAsLeft() bool {
	link, _, isVXLAN, err := n.b.k.VXLANByName(n.b.dev.Name)
	if err != nil || !isVXLAN || !link.Up || int64(link.Index) != n.devSeen.Load() {
		return false
	}
	on, err := n.b.k.TXChecksum(n.b.dev.Name)
	return err == nil && on == n.b.txChecksum
}
