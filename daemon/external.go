package daemon

import (
	"context"
	"slices"
	"sync/atomic"

	"golang.org/x/sync/errgroup"

	"github.com/twill-net/twill/backend"
	"github.com/twill-net/twill/backend/kernelsync"
	"github.com/twill-net/twill/network"
	"github.com/twill-net/twill/nl"
)

// extWatch follows the external interface. The kernel flushes the routes
// through a link that goes down without announcing their removal, and a
// link deleted and re-created (a VLAN or bond rebuilt, a network service
// restarted) comes back with a new index: either way the backend's record
// of the kernel is wrong until it reads the kernel again.
type extWatch struct {
	name  string
	opts  network.IfaceOptions
	index atomic.Int64 // the interface's current index, followed from link events
	dirty atomic.Bool  // the interface changed since the last reconcile
	// last is the interface as last handed to the backend.
	last atomic.Pointer[backend.ExternalInterface]
	gone bool // owned by the reconcile loop: last refresh failed
}

// watchExternal marks the external interface dirty and pokes the loop on
// every link or address event that concerns it. It calls watching once
// both its watches have subscribed (and checked what changed before).
func (d *Daemon) watchExternal(ctx context.Context, watching func()) error {
	h := d.o.Netlink
	changed := func() {
		d.ext.dirty.Store(true)
		d.signal()
	}
	// Once (re)subscribed, only a change made before counts: with tens of
	// thousands of peers, a full reconcile for nothing costs a second.
	checked := kernelsync.AllChecked(2, watching)
	subscribed := func(checked func()) func() {
		return func() {
			if !d.externalAsLeft() {
				d.log.Debug("the external interface changed before its watch began", "iface", d.ext.name)
				changed()
			}
			checked()
		}
	}
	g, ctx := errgroup.WithContext(ctx)
	g.Go(func() error {
		return kernelsync.WatchLoop(ctx, d.log, "link", subscribed(checked[0]), func(ctx context.Context, subscribed func()) error {
			return h.WatchLinks(ctx, subscribed, func(ev nl.LinkEvent) {
				if ev.Link.Name == d.ext.name || int64(ev.Link.Index) == d.ext.index.Load() {
					if !ev.Deleted && ev.Link.Name == d.ext.name {
						d.ext.index.Store(int64(ev.Link.Index))
					}
					changed()
				}
			})
		})
	})
	g.Go(func() error {
		return kernelsync.WatchLoop(ctx, d.log, "address", subscribed(checked[1]), func(ctx context.Context, subscribed func()) error {
			return h.WatchAddrs(ctx, subscribed, func(ev nl.AddrEvent) {
				// A new or changed address matters only if it changes what
				// the backend was given (an IPv6 link-local address
				// finishing DAD does not; a full reconcile for it costs a
				// dump of every route). A removal always counts: the
				// kernel drops routes with it, and the address may be back
				// before this runs. Link events always count too: a link
				// that went down and up again looks unchanged, but lost
				// its routes.
				if int64(ev.LinkIndex) == d.ext.index.Load() && (ev.Deleted || !d.externalAsLeft()) {
					changed()
				}
			})
		})
	})
	return g.Wait()
}

// refreshExternal reads the external interface again and hands it to the
// backend. Called by the reconcile loop, before Reconcile.
func (d *Daemon) refreshExternal(nw backend.Attached) {
	ext, err := network.Refresh(d.o.Netlink, d.ext.name, d.ext.opts)
	if err != nil {
		if !d.ext.gone {
			d.log.Warn("external interface unusable; routes through it come back once it is", "iface", d.ext.name, "err", err)
		}
		d.ext.gone = true
		d.ext.last.Store(nil) // every event counts until the interface is back
		return
	}
	if d.ext.gone || !ext.Link.Up {
		d.log.Info("external interface changed; reprogramming through it", "iface", ext.Link.Name, "index", ext.Link.Index, "up", ext.Link.Up, "addr", ext.Addr)
	}
	d.ext.gone = !ext.Link.Up
	d.ext.last.Store(&ext)
	if nw.External != nil {
		nw.External.ExternalChanged(ext)
	}
}

// externalAsLeft reports whether the external interface is as the backend
// last got it.
func (d *Daemon) externalAsLeft() bool {
	last := d.ext.last.Load()
	now, err := network.Refresh(d.o.Netlink, d.ext.name, d.ext.opts)
	return last != nil && err == nil && sameExternal(*last, now)
}

// sameExternal reports whether a and b route alike.
func sameExternal(a, b backend.ExternalInterface) bool {
	return a.Link.Index == b.Link.Index && a.Link.Up == b.Link.Up && a.Link.MTU == b.Link.MTU &&
		a.Addr == b.Addr && a.AddrV6 == b.AddrV6 && a.PublicIP == b.PublicIP && a.PublicIPv6 == b.PublicIPv6 &&
		slices.Equal(a.OnLink, b.OnLink)
}
