package nl

import (
	"encoding/binary"
	"errors"
	"slices"
	"testing"

	"golang.org/x/sys/unix"
)

// appendMessage appends a netlink message with the given header fields and
// payload, padded to the alignment.
func appendMessage(b []byte, typ, flags uint16, seq uint32, payload []byte) []byte {
	b = binary.NativeEndian.AppendUint32(b, uint32(unix.NLMSG_HDRLEN+len(payload)))
	b = binary.NativeEndian.AppendUint16(b, typ)
	b = binary.NativeEndian.AppendUint16(b, flags)
	b = binary.NativeEndian.AppendUint32(b, seq)
	b = binary.NativeEndian.AppendUint32(b, 0)
	b = append(b, payload...)
	for len(b)%unix.NLMSG_ALIGNTO != 0 {
		b = append(b, 0)
	}
	return b
}

func TestEachMessage(t *testing.T) {
	ack := binary.NativeEndian.AppendUint32(nil, 0)
	refused := binary.NativeEndian.AppendUint32(nil, uint32(0xffffffff-uint32(unix.EEXIST)+1)) // -EEXIST
	var b []byte
	b = appendMessage(b, unix.RTM_NEWROUTE, unix.NLM_F_MULTI, 7, []byte{1, 2, 3}) // payload needs padding
	b = appendMessage(b, unix.NLMSG_ERROR, 0, 8, ack)
	b = appendMessage(b, unix.NLMSG_ERROR, 0, 9, refused)
	b = appendMessage(b, unix.NLMSG_DONE, 0, 10, nil)

	var got []message
	if err := eachMessage(b, func(m message) bool { got = append(got, m); return true }); err != nil {
		t.Fatal(err)
	}
	if len(got) != 4 {
		t.Fatalf("%d messages, want 4", len(got))
	}
	if m := got[0]; m.typ != unix.RTM_NEWROUTE || m.flags != unix.NLM_F_MULTI || m.seq != 7 || !slices.Equal(m.payload, []byte{1, 2, 3}) {
		t.Errorf("first message %+v", m)
	}
	if code, ok := got[0].errno(); ok || code != 0 {
		t.Errorf("a route message read as an error message (%v)", code)
	}
	if code, ok := got[1].errno(); !ok || code != 0 {
		t.Errorf("ack: errno %v, %v; want 0, true", code, ok)
	}
	if code, ok := got[2].errno(); !ok || code != unix.EEXIST {
		t.Errorf("refusal: errno %v, %v; want EEXIST, true", code, ok)
	}
	if got[3].typ != unix.NLMSG_DONE || got[3].seq != 10 {
		t.Errorf("last message %+v", got[3])
	}

	n := 0
	if err := eachMessage(b, func(message) bool { n++; return n < 2 }); err != nil || n != 2 {
		t.Errorf("stopping at the second message: %d read, %v", n, err)
	}

	// The DONE message's header claims four bytes more than the read has.
	overlong := slices.Clone(b)
	binary.NativeEndian.PutUint32(overlong[len(overlong)-unix.NLMSG_HDRLEN:], unix.NLMSG_HDRLEN+4)
	for _, tc := range []struct {
		name   string
		read   []byte
		before int // messages handed on before the bad one
	}{
		{"length past the read", append(slices.Clone(b), 0xff, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0), 4},
		{"length under the header", append(slices.Clone(b), 4, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0), 4},
		{"last message longer than the read", overlong, 3},
	} {
		n := 0
		err := eachMessage(tc.read, func(message) bool { n++; return true })
		if !errors.Is(err, errMalformed) || n != tc.before {
			t.Errorf("%s: %d messages, %v; want %d, errMalformed", tc.name, n, err, tc.before)
		}
	}
}

// FuzzRouteEvents feeds arbitrary reads to the route- and neighbour-event
// decoders: they never panic, and every payload handed on lies inside the
// read.
func FuzzRouteEvents(f *testing.F) {
	var b []byte
	b = appendMessage(b, unix.RTM_NEWROUTE, 0, 0, make([]byte, unix.SizeofRtMsg))
	f.Add(b)
	f.Add(appendMessage(nil, unix.NLMSG_ERROR, 0, 1, []byte{0, 0}))
	f.Add([]byte{0xff, 0xff, 0xff, 0xff})
	f.Add(appendMessage(nil, unix.RTM_NEWNEIGH, 0, 0, make([]byte, unix.SizeofNdMsg)))
	f.Fuzz(func(t *testing.T, data []byte) {
		total := 0
		_ = eachMessage(data, func(m message) bool { total += unix.NLMSG_HDRLEN + len(m.payload); return true })
		if total > len(data) {
			t.Fatalf("payloads cover %d bytes of a %d-byte read", total, len(data))
		}
		routeEvents(data, func(RouteEvent) {})
		neighEvents(data, func(NeighEvent) {})
	})
}
