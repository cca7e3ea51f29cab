package nl

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"runtime"
	"sync"

	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// Batched route changes.
//
// Programming thousands of routes one request at a time through the netlink
// library costs a round trip and a 64 KiB receive buffer per route. A batch
// instead writes many route messages in one sendto, only the last asking
// for an ack, and reads what comes back into one reused buffer. The kernel
// still applies each message on its own, so one failing route does not stop
// the others, and each failure gets its own error.

// batchSize bounds the messages in flight, keeping well under the socket's
// receive buffer for the acks.
const batchSize = 256

type batcher struct {
	mu  sync.Mutex
	fd  int    // guarded by mu; -1 until opened
	seq uint32 // guarded by mu
	buf []byte // guarded by mu
	rcv []byte // guarded by mu
}

// RouteBatch applies ops in order and returns one error (or nil) per op.
func (h *Handle) RouteBatch(ops []RouteOp) []error {
	return h.batchRun(len(ops), func(i int, buf []byte, seq uint32) []byte { return appendRouteMsg(buf, ops[i], seq) },
		func(i int, errno unix.Errno) error {
			if ops[i].Op == OpDel && errno == unix.ESRCH {
				return nil
			}
			return opError(ops[i], errno)
		})
}

// NeighBatch applies neighbour and FDB changes in order and returns one
// error (or nil) per op. Deleting an entry that is gone is not an error.
func (h *Handle) NeighBatch(ops []NeighOp) []error {
	return h.batchRun(len(ops), func(i int, buf []byte, seq uint32) []byte { return appendNeighMsg(buf, ops[i], seq) },
		func(i int, errno unix.Errno) error {
			if ops[i].Op == OpDel && (errno == unix.ENOENT || errno == unix.ESRCH) {
				return nil
			}
			what := "neighbour"
			if ops[i].FDB {
				what = "fdb entry"
			}
			verb := "setting"
			if ops[i].Op == OpDel {
				verb = "deleting"
			}
			return fmt.Errorf("%s %s %s %s on link #%d: %w", verb, what, ops[i].Neigh.IP, net.HardwareAddr(ops[i].Neigh.HardwareAddr), ops[i].Neigh.LinkIndex, errno)
		})
}

// batchRun sends n messages made by encode, batchSize at a time, and maps
// each failed ack's errno through fail.
func (h *Handle) batchRun(n int, encode func(i int, buf []byte, seq uint32) []byte, fail func(i int, errno unix.Errno) error) []error {
	errs := make([]error, n)
	b := &h.batch
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.fd < 0 {
		fd, err := h.socket()
		if err != nil {
			for i := range errs {
				errs[i] = err
			}
			return errs
		}
		b.fd = fd
	}
	for start := 0; start < n; start += batchSize {
		end := min(start+batchSize, n)
		b.runLocked(start, end, encode, fail, errs[start:end])
	}
	return errs
}

// socket opens a NETLINK_ROUTE socket in the handle's namespace, for
// requests. Creating a socket binds it to the namespace of the creating
// thread, so the thread switches there and back while locked; if it cannot
// switch back, the goroutine exits locked and the runtime discards the
// thread.
func (h *Handle) socket() (int, error) { return h.socketGroups(0) }

// socketGroups is socket subscribed to the multicast groups given (a
// bitmask of RTMGRP_*), with a receive buffer of watchReceiveBuffer when
// it subscribes to any.
func (h *Handle) socketGroups(groups uint32) (int, error) {
	fd, err := inNS(h, func() (int, error) {
		fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_ROUTE)
		if err != nil {
			return -1, err
		}
		err = unix.Bind(fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK, Groups: groups})
		switch {
		case err == nil && groups != 0:
			err = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, watchReceiveBuffer)
		case err == nil:
			// Acks without the echoed request, and room for a full
			// batch of them.
			_ = unix.SetsockoptInt(fd, unix.SOL_NETLINK, unix.NETLINK_CAP_ACK, 1)
			_ = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUF, 1<<20)
		}
		if err != nil {
			unix.Close(fd)
			return -1, err
		}
		return fd, nil
	}, func(fd int) { unix.Close(fd) })
	if err != nil {
		return -1, fmt.Errorf("opening netlink socket: %w", err)
	}
	return fd, nil
}

// inNS runs open on a thread inside the handle's namespace (or the
// caller's, for a handle bound to it), for what binds to the namespace it
// is created in, such as a socket. If the thread cannot leave the
// namespace again, what open returned is closed and the thread is not
// reused.
func inNS[T any](h *Handle, open func() (T, error), closeIt func(T)) (T, error) {
	type result struct {
		v   T
		err error
	}
	ch := make(chan result, 1)
	go func() {
		var zero T
		runtime.LockOSThread()
		if h.ns < 0 {
			v, err := open()
			runtime.UnlockOSThread()
			ch <- result{v, err}
			return
		}
		cur, err := netns.Get()
		if err != nil {
			runtime.UnlockOSThread()
			ch <- result{zero, fmt.Errorf("reading current netns: %w", err)}
			return
		}
		defer cur.Close()
		if err := netns.Set(h.ns); err != nil {
			runtime.UnlockOSThread()
			ch <- result{zero, fmt.Errorf("entering netns: %w", err)}
			return
		}
		v, err := open()
		if rerr := netns.Set(cur); rerr != nil {
			if err == nil {
				closeIt(v)
			}
			ch <- result{zero, fmt.Errorf("leaving netns: %w", rerr)}
			return // exit locked: the thread is not reused
		}
		runtime.UnlockOSThread()
		ch <- result{v, err}
	}()
	r := <-ch
	return r.v, r.err
}

func (b *batcher) closeLocked() {
	if b.fd >= 0 {
		unix.Close(b.fd)
		b.fd = -1
	}
}

func (b *batcher) runLocked(start, end int, encode func(int, []byte, uint32) []byte, fail func(int, unix.Errno) error, errs []error) {
	b.buf = b.buf[:0]
	first := b.seq + 1
	count := end - start
	for i := start; i < end; i++ {
		b.seq++
		at := len(b.buf)
		b.buf = encode(i, b.buf, b.seq)
		if i < end-1 {
			// Only the last message asks for an ack: the kernel applies
			// them in order and reports every failure whether asked or
			// not, so once the last one's ack is read, every failure
			// before it has been too.
			flags := binary.NativeEndian.Uint16(b.buf[at+6:])
			binary.NativeEndian.PutUint16(b.buf[at+6:], flags&^unix.NLM_F_ACK)
		}
	}
	last := b.seq
	if err := unix.Sendto(b.fd, b.buf, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		for i := range errs {
			errs[i] = fmt.Errorf("sending route batch: %w", err)
		}
		return
	}
	if cap(b.rcv) == 0 {
		b.rcv = make([]byte, 64<<10)
	}
	for acked := false; !acked; {
		n, _, err := unix.Recvfrom(b.fd, b.rcv[:cap(b.rcv)], 0)
		if err != nil {
			if errors.Is(err, unix.EINTR) {
				continue
			}
			unanswered(errs, fmt.Errorf("reading route batch acks: %w", err))
			b.closeLocked() // the stream is out of step; start afresh next time
			return
		}
		err = eachMessage(b.rcv[:n], func(m message) bool {
			// seq-first is modular: a batch may wrap the sequence numbers.
			if code, ok := m.errno(); ok && m.seq-first < uint32(count) {
				i := int(m.seq - first)
				if code != 0 {
					errs[i] = fail(start+i, code)
				}
				acked = acked || m.seq == last
			}
			return true
		})
		if err != nil {
			// The kernel does not send these; an ack may be lost in it, so
			// waiting on would wait forever.
			unanswered(errs, fmt.Errorf("reading route batch acks: %w", err))
			b.closeLocked()
			return
		}
	}
}

// unanswered sets err for every op without an error yet.
func unanswered(errs []error, err error) {
	for i := range errs {
		if errs[i] == nil {
			errs[i] = err
		}
	}
}

func opError(op RouteOp, err error) error {
	switch op.Op {
	case OpAdd:
		return fmt.Errorf("adding route %s: %w", op.Route, err)
	case OpReplace:
		return fmt.Errorf("replacing route %s: %w", op.Route, err)
	default:
		return fmt.Errorf("deleting route %s: %w", op.Route, err)
	}
}

// appendRouteMsg encodes one RTM_NEWROUTE / RTM_DELROUTE request.
func appendRouteMsg(buf []byte, op RouteOp, seq uint32) []byte {
	r := op.Route
	start := len(buf)
	typ := uint16(unix.RTM_NEWROUTE)
	flags := uint16(unix.NLM_F_REQUEST | unix.NLM_F_ACK)
	switch op.Op {
	case OpAdd:
		flags |= unix.NLM_F_CREATE | unix.NLM_F_EXCL
	case OpReplace:
		flags |= unix.NLM_F_CREATE | unix.NLM_F_REPLACE
	case OpDel:
		typ = unix.RTM_DELROUTE
	}
	buf = binary.NativeEndian.AppendUint32(buf, 0) // length, patched below
	buf = binary.NativeEndian.AppendUint16(buf, typ)
	buf = binary.NativeEndian.AppendUint16(buf, flags)
	buf = binary.NativeEndian.AppendUint32(buf, seq)
	buf = binary.NativeEndian.AppendUint32(buf, 0) // port id: the kernel
	family := byte(unix.AF_INET)
	if r.Dst.Addr().Is6() {
		family = unix.AF_INET6
	}
	table := r.table()
	rtTable := byte(unix.RT_TABLE_UNSPEC)
	if table < 256 {
		rtTable = byte(table)
	}
	var rtFlags uint32
	if r.OnLink {
		rtFlags |= unix.RTNH_F_ONLINK
	}
	buf = append(buf, family, byte(r.Dst.Bits()), 0, 0, rtTable, byte(r.Protocol), byte(r.Scope), r.rtnType())
	buf = binary.NativeEndian.AppendUint32(buf, rtFlags)
	buf = appendAttr(buf, unix.RTA_DST, r.Dst.Addr().AsSlice())
	if r.Gw.IsValid() {
		buf = appendAttr(buf, unix.RTA_GATEWAY, r.Gw.AsSlice())
	}
	if r.Src.IsValid() {
		buf = appendAttr(buf, unix.RTA_PREFSRC, r.Src.AsSlice())
	}
	if r.LinkIndex != 0 {
		buf = appendAttr(buf, unix.RTA_OIF, binary.NativeEndian.AppendUint32(nil, uint32(r.LinkIndex)))
	}
	buf = appendAttr(buf, unix.RTA_TABLE, binary.NativeEndian.AppendUint32(nil, uint32(table)))
	if r.Priority != 0 {
		buf = appendAttr(buf, unix.RTA_PRIORITY, binary.NativeEndian.AppendUint32(nil, uint32(r.Priority)))
	}
	binary.NativeEndian.PutUint32(buf[start:], uint32(len(buf)-start))
	return buf
}

// appendNeighMsg encodes one RTM_NEWNEIGH / RTM_DELNEIGH request.
func appendNeighMsg(buf []byte, op NeighOp, seq uint32) []byte {
	n := op.Neigh
	start := len(buf)
	typ := uint16(unix.RTM_NEWNEIGH)
	flags := uint16(unix.NLM_F_REQUEST | unix.NLM_F_ACK)
	if op.Op == OpDel {
		typ = unix.RTM_DELNEIGH
	} else {
		flags |= unix.NLM_F_CREATE | unix.NLM_F_REPLACE
	}
	buf = binary.NativeEndian.AppendUint32(buf, 0)
	buf = binary.NativeEndian.AppendUint16(buf, typ)
	buf = binary.NativeEndian.AppendUint16(buf, flags)
	buf = binary.NativeEndian.AppendUint32(buf, seq)
	buf = binary.NativeEndian.AppendUint32(buf, 0)
	family := byte(unix.AF_INET)
	if n.IP.Is6() {
		family = unix.AF_INET6
	}
	var ntf byte
	if op.FDB {
		family, ntf = unix.AF_BRIDGE, unix.NTF_SELF
	}
	state := uint16(unix.NUD_PERMANENT)
	// struct ndmsg: family, 3 pad, ifindex, state, flags, type
	buf = append(buf, family, 0, 0, 0)
	buf = binary.NativeEndian.AppendUint32(buf, uint32(n.LinkIndex))
	buf = binary.NativeEndian.AppendUint16(buf, state)
	buf = append(buf, ntf, 0)
	if n.IP.IsValid() {
		buf = appendAttr(buf, unix.NDA_DST, n.IP.AsSlice())
	}
	if len(n.HardwareAddr) > 0 {
		buf = appendAttr(buf, unix.NDA_LLADDR, n.HardwareAddr)
	}
	binary.NativeEndian.PutUint32(buf[start:], uint32(len(buf)-start))
	return buf
}

func appendAttr(buf []byte, typ uint16, data []byte) []byte {
	l := 4 + len(data)
	buf = binary.NativeEndian.AppendUint16(buf, uint16(l))
	buf = binary.NativeEndian.AppendUint16(buf, typ)
	buf = append(buf, data...)
	for pad := (4 - l%4) % 4; pad > 0; pad-- {
		buf = append(buf, 0)
	}
	return buf
}
