package nl

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"slices"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// nlaTypeMask strips the nested and byte-order flags from an attribute type.
const nlaTypeMask = 0x3fff

// dumpBufSize is the receive buffer of a dump: the kernel fills at most
// 32 KiB per read.
const dumpBufSize = 64 << 10

// maxDumpReads bounds the reads of one dump (each holds many objects: a
// dump of a million routes takes a few thousand).
const maxDumpReads = 1 << 20

// dump sends one NLM_F_DUMP request of type typ with body on a socket of
// its own in the handle's namespace (so that a long dump never holds up
// the batched writes), and passes the payload of every message the kernel
// answers with to each. An interrupted dump (the table changed while it
// was read) returns netlink.ErrDumpInterrupted after the whole answer, as
// the netlink package does, so retryDump can read it again.
func (h *Handle) dump(typ uint16, body []byte, each func(payload []byte)) error {
	fd, err := h.socket()
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	const seq = 1
	req := binary.NativeEndian.AppendUint32(nil, uint32(unix.NLMSG_HDRLEN+len(body)))
	req = binary.NativeEndian.AppendUint16(req, typ)
	req = binary.NativeEndian.AppendUint16(req, unix.NLM_F_REQUEST|unix.NLM_F_DUMP)
	req = binary.NativeEndian.AppendUint32(req, seq)
	req = binary.NativeEndian.AppendUint32(req, 0)
	req = append(req, body...)
	if err := unix.Sendto(fd, req, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return fmt.Errorf("sending dump request: %w", err)
	}
	buf := make([]byte, dumpBufSize)
	interrupted := false
	for range maxDumpReads {
		n, _, err := unix.Recvfrom(fd, buf, 0)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return fmt.Errorf("reading dump: %w", err)
		}
		var done bool
		var result error
		err = eachMessage(buf[:n], func(m message) bool {
			if m.seq != seq {
				return true
			}
			interrupted = interrupted || m.flags&unix.NLM_F_DUMP_INTR != 0
			switch m.typ {
			case unix.NLMSG_DONE:
				done = true
				if interrupted {
					result = netlink.ErrDumpInterrupted
				}
			case unix.NLMSG_ERROR:
				done = true
				if code, _ := m.errno(); code != 0 {
					result = fmt.Errorf("dump: %w", code)
				}
			default:
				each(m.payload)
			}
			return !done
		})
		if err != nil {
			return fmt.Errorf("reading dump: %w", err)
		}
		if done {
			return result
		}
	}
	return errors.New("reading dump: no end after too many reads")
}

// appendGrown appends v to s, doubling s's capacity when it is full.
// append grows a large slice by a quarter at a time: a dump of 50,000
// routes would copy itself some thirty times and allocate five times its
// final size, which the garbage collector then has to catch up with.
func appendGrown[T any](s []T, v T) []T {
	if len(s) == cap(s) {
		s = slices.Grow(s, max(len(s), 64))
	}
	return append(s, v)
}

// attrs calls each for every route attribute in b (type and value),
// stopping at the first malformed one.
func attrs(b []byte, each func(typ uint16, v []byte)) {
	for len(b) >= unix.SizeofRtAttr {
		l := int(binary.NativeEndian.Uint16(b[0:2]))
		if l < unix.SizeofRtAttr || l > len(b) {
			return
		}
		each(binary.NativeEndian.Uint16(b[2:4])&nlaTypeMask, b[unix.SizeofRtAttr:l])
		b = b[min((l+unix.RTA_ALIGNTO-1)&^(unix.RTA_ALIGNTO-1), len(b)):]
	}
}

// ownType reports whether a route of type typ and protocol proto is one a
// dump or a watch decodes: unicast, or a blackhole twill made. Anyone
// else's blackhole, like every other type, stays out of dumps (and a watch
// marks it NonUnicast: put at twill's route's key, it replaced it).
func ownType(typ, proto uint8) bool {
	return typ == unix.RTN_UNICAST || (typ == unix.RTN_BLACKHOLE && proto == RouteProtocol)
}

// routeDumpRequest is the struct rtmsg of a route dump of one family.
func routeDumpRequest(family Family) []byte {
	b := make([]byte, unix.SizeofRtMsg)
	b[0] = byte(family)
	return b
}

// parseRoute decodes an RTM_NEWROUTE payload (struct rtmsg and its
// attributes) and reports whether it is a unicast IPv4 or IPv6 route (or a
// blackhole of twill's, see ownType) that
// f and family select, the way the netlink package's filtered list does:
// cloned routes are left out, the table is RTA_TABLE when present, a route
// without RTA_DST is the default route of its family.
func parseRoute(p []byte, family Family, f RouteFilter) (Route, bool) {
	if len(p) < unix.SizeofRtMsg {
		return Route{}, false
	}
	fam, dstLen := p[0], int(p[1])
	if (fam != unix.AF_INET && fam != unix.AF_INET6) || (family != FamilyAll && Family(fam) != family) {
		return Route{}, false
	}
	rtFlags := binary.NativeEndian.Uint32(p[8:12])
	if !ownType(p[7], p[5]) || rtFlags&unix.RTM_F_CLONED != 0 {
		return Route{}, false
	}
	r := Route{Table: int(p[4]), Protocol: int(p[5]), Scope: Scope(p[6]), OnLink: rtFlags&unix.RTNH_F_ONLINK != 0}
	if p[7] == unix.RTN_BLACKHOLE {
		r.Type = RouteBlackhole
	}
	var dst netip.Addr
	attrs(p[unix.SizeofRtMsg:], func(typ uint16, v []byte) {
		switch typ {
		case unix.RTA_DST:
			dst, _ = addrOf(fam, v)
		case unix.RTA_GATEWAY:
			r.Gw, _ = addrOf(fam, v)
		case unix.RTA_PREFSRC:
			r.Src, _ = addrOf(fam, v)
		case unix.RTA_OIF:
			if len(v) >= 4 {
				r.LinkIndex = int(binary.NativeEndian.Uint32(v))
			}
		case unix.RTA_PRIORITY:
			if len(v) >= 4 {
				r.Priority = int(binary.NativeEndian.Uint32(v))
			}
		case unix.RTA_TABLE:
			if len(v) >= 4 {
				r.Table = int(binary.NativeEndian.Uint32(v))
			}
		}
	})
	if !dst.IsValid() {
		dst = netip.IPv4Unspecified()
		if fam == unix.AF_INET6 {
			dst = netip.IPv6Unspecified()
		}
	}
	r.Gw, r.Src = r.Gw.Unmap(), r.Src.Unmap()
	if r.Type == RouteBlackhole {
		r.LinkIndex = 0 // an IPv6 blackhole is reported on lo
	}
	r.Dst = netip.PrefixFrom(dst, dstLen)
	if !r.Dst.IsValid() {
		return Route{}, false
	}
	want := f.Table
	if want == 0 {
		want = unix.RT_TABLE_MAIN
	}
	switch {
	case !f.AllTables && r.Table != want:
		return Route{}, false
	case f.Protocol != 0 && r.Protocol != f.Protocol:
		return Route{}, false
	case f.LinkIndex != 0 && r.LinkIndex != f.LinkIndex:
		return Route{}, false
	}
	return r, true
}

// addrOf is the address of family fam in v.
func addrOf(fam byte, v []byte) (netip.Addr, bool) {
	switch {
	case fam == unix.AF_INET && len(v) == 4:
		return netip.AddrFrom4([4]byte(v)), true
	case fam == unix.AF_INET6 && len(v) == 16:
		return netip.AddrFrom16([16]byte(v)), true
	}
	return netip.Addr{}, false
}

// neighDumpRequest is the struct ndmsg of a neighbour (or, with
// AF_BRIDGE, FDB) dump: the one the netlink package sends. Without strict
// checking the kernel answers with every link's entries.
func neighDumpRequest(family byte, index int) []byte {
	b := make([]byte, unix.SizeofNdMsg)
	b[0] = family
	binary.NativeEndian.PutUint32(b[4:8], uint32(index))
	return b
}

// parseNeigh decodes an RTM_NEWNEIGH payload (struct ndmsg and its
// attributes) and reports whether it is an entry of link index in family
// (0: any) with an address (NDA_DST: a neighbour's IP, an FDB entry's
// remote), as the netlink package's list and twill's use of it did.
func parseNeigh(p []byte, family byte, index int) (Neigh, bool) {
	if len(p) < unix.SizeofNdMsg {
		return Neigh{}, false
	}
	fam := p[0]
	n := Neigh{LinkIndex: int(binary.NativeEndian.Uint32(p[4:8]))}
	state := binary.NativeEndian.Uint16(p[8:10])
	if (index != 0 && n.LinkIndex != index) || (family != 0 && fam != family) {
		return Neigh{}, false
	}
	n.Permanent = state&unix.NUD_PERMANENT != 0
	attrs(p[unix.SizeofNdMsg:], func(typ uint16, v []byte) {
		switch typ {
		case unix.NDA_DST:
			if a, ok := netip.AddrFromSlice(v); ok {
				n.IP = a.Unmap()
			}
		case unix.NDA_LLADDR:
			if len(v) != 4 {
				n.HardwareAddr = append([]byte(nil), v...)
			}
		}
	})
	return n, n.IP.IsValid()
}
