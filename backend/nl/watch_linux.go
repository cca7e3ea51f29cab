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
	fd, err := h.socketGroups(unix.RTMGRP_IPV4_ROUTE | unix.RTMGRP_IPV6_ROUTE)
	if err != nil {
		return fmt.Errorf("subscribing to route updates: %w", err)
	}
	if err := unix.SetNonblock(fd, true); err != nil {
		unix.Close(fd)
		return fmt.Errorf("subscribing to route updates: %w", err)
	}
	// Non-blocking, the file waits in the runtime's poller, and closing it
	// (when ctx is done) ends a wait.
	f := os.NewFile(uintptr(fd), "route events")
	defer f.Close()
	rc, err := f.SyscallConn()
	if err != nil {
		return fmt.Errorf("subscribing to route updates: %w", err)
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
			return fmt.Errorf("receiving route updates: %w", err)
		}
		if nl, ok := from.(*unix.SockaddrNetlink); !ok || nl.Pid != 0 {
			continue // only the kernel speaks for the kernel
		}
		routeEvents(buf[:n], fn)
	}
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
		other := p[7] != unix.RTN_UNICAST
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
