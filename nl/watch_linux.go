package nl

import (
	"context"
	"errors"
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// WatchRoutes calls subscribed once subscribed, then fn for every change to
// a route with a destination (default routes aside) in the handle's
// namespace, until ctx is done; neither may block. Non-unicast routes are
// marked (RouteEvent.NonUnicast). Events are
// decoded as dumps are (parseRoute), on a socket of their own: a burst of
// thousands (a start-up, a mass lease change) costs no allocation per
// route. It returns an error when the subscription breaks (ENOBUFS: events
// were lost, and the caller must read the kernel again).
func (h *Handle) WatchRoutes(ctx context.Context, subscribed func(), fn func(RouteEvent)) error {
	return h.watch(ctx, unix.RTMGRP_IPV4_ROUTE|unix.RTMGRP_IPV6_ROUTE, "route", subscribed, func(b []byte) { routeEvents(b, fn) })
}

// WatchNeighs calls subscribed once subscribed, then fn for every change to
// a neighbour or FDB entry with an address (a neighbour's IP, an FDB
// entry's remote) in the handle's namespace, until ctx is done; neither
// may block. Like WatchRoutes it decodes as dumps do (parseNeigh), on a
// socket of its own, and returns an error when the subscription breaks.
func (h *Handle) WatchNeighs(ctx context.Context, subscribed func(), fn func(NeighEvent)) error {
	return h.watch(ctx, unix.RTMGRP_NEIGH, "neighbour", subscribed, func(b []byte) { neighEvents(b, fn) })
}

// watch subscribes to groups and hands each read the kernel sends to
// handle until ctx is done.
func (h *Handle) watch(ctx context.Context, groups uint32, what string, subscribed func(), handle func([]byte)) error {
	fd, err := h.socketGroups(groups)
	if err != nil {
		return fmt.Errorf("subscribing to %s updates: %w", what, err)
	}
	if err := unix.SetNonblock(fd, true); err != nil {
		unix.Close(fd)
		return fmt.Errorf("subscribing to %s updates: %w", what, err)
	}
	// Non-blocking, the file waits in the runtime's poller, and closing it
	// (when ctx is done) ends a wait.
	f := os.NewFile(uintptr(fd), what+" events")
	defer f.Close()
	rc, err := f.SyscallConn()
	if err != nil {
		return fmt.Errorf("subscribing to %s updates: %w", what, err)
	}
	defer context.AfterFunc(ctx, func() { f.Close() })()
	if subscribed != nil {
		subscribed()
	}
	buf := make([]byte, dumpBufSize)
	for {
		var (
			n    int
			from unix.Sockaddr
			rerr error
		)
		err := rc.Read(func(fd uintptr) bool {
			n, from, rerr = unix.Recvfrom(int(fd), buf, 0)
			return !errors.Is(rerr, unix.EAGAIN)
		})
		if ctx.Err() != nil {
			return nil
		}
		if err == nil {
			err = rerr
		}
		switch {
		case errors.Is(err, unix.EINTR):
			continue
		case err != nil:
			return fmt.Errorf("receiving %s updates: %w", what, err)
		}
		if nl, ok := from.(*unix.SockaddrNetlink); !ok || nl.Pid != 0 {
			continue // only the kernel speaks for the kernel
		}
		handle(buf[:n])
	}
}

// neighEvents hands fn the neighbour and FDB changes in one read of a
// subscription.
func neighEvents(msg []byte, fn func(NeighEvent)) {
	_ = eachMessage(msg, func(m message) bool { // a malformed tail is dropped; the next check reads the kernel
		if m.typ != unix.RTM_NEWNEIGH && m.typ != unix.RTM_DELNEIGH || len(m.payload) == 0 {
			return true
		}
		if n, ok := parseNeigh(m.payload, 0, 0); ok {
			fn(NeighEvent{Deleted: m.typ == unix.RTM_DELNEIGH, FDB: m.payload[0] == unix.AF_BRIDGE, Neigh: n})
		}
		return true
	})
}

// routeEvents hands fn the route changes in one read of a subscription.
func routeEvents(msg []byte, fn func(RouteEvent)) {
	_ = eachMessage(msg, func(m message) bool { // a malformed tail is dropped; the next check reads the kernel
		if m.typ != unix.RTM_NEWROUTE && m.typ != unix.RTM_DELROUTE {
			return true
		}
		p := m.payload
		if len(p) < unix.SizeofRtMsg || p[1] == 0 {
			return true // a default route
		}
		other := !ownType(p[7], p[5])
		if other {
			// Decoded as the unicast route it stands in for (rare: the
			// copy costs nothing that matters).
			p = append([]byte(nil), p...)
			p[7] = unix.RTN_UNICAST
		}
		if r, ok := parseRoute(p, FamilyAll, RouteFilter{AllTables: true}); ok {
			fn(RouteEvent{Deleted: m.typ == unix.RTM_DELROUTE, Route: r, NonUnicast: other})
		}
		return true
	})
}
