package nl

import (
	"encoding/binary"
	"errors"

	"golang.org/x/sys/unix"
)

// message is one netlink message read from a socket: its header's fields
// and its payload (a slice of the read buffer).
type message struct {
	typ, flags uint16
	seq        uint32
	payload    []byte
}

// errno is the code an NLMSG_ERROR message carries (0 for an ack), and
// whether the message is one.
func (m message) errno() (unix.Errno, bool) {
	if m.typ != unix.NLMSG_ERROR || len(m.payload) < 4 {
		return 0, false
	}
	return unix.Errno(-int32(binary.NativeEndian.Uint32(m.payload))), true
}

// errMalformed is a message header that does not fit the read.
var errMalformed = errors.New("malformed netlink message")

// eachMessage calls each for every message in one read, in order, until
// each returns false. A header whose length does not fit ends the walk
// with errMalformed (the messages before it have been handed on).
func eachMessage(b []byte, each func(message) bool) error {
	for len(b) >= unix.NLMSG_HDRLEN {
		l := int(binary.NativeEndian.Uint32(b[0:4]))
		if l < unix.NLMSG_HDRLEN || l > len(b) {
			return errMalformed
		}
		m := message{
			typ:     binary.NativeEndian.Uint16(b[4:6]),
			flags:   binary.NativeEndian.Uint16(b[6:8]),
			seq:     binary.NativeEndian.Uint32(b[8:12]),
			payload: b[unix.NLMSG_HDRLEN:l],
		}
		if !each(m) {
			return nil
		}
		b = b[min((l+unix.NLMSG_ALIGNTO-1)&^(unix.NLMSG_ALIGNTO-1), len(b)):]
	}
	return nil
}
