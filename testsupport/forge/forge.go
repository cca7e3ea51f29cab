// Package forge sends UDP datagrams with a source address of the caller's
// choosing, from inside a network namespace, through a raw socket: what a
// pod with CAP_NET_RAW (a container runtime's default) can do. The tests
// that claim a pod cannot pose as another attack with it.
package forge

import (
	"encoding/binary"
	"fmt"
	"net/netip"

	"github.com/containernetworking/plugins/pkg/ns"
	"golang.org/x/sys/unix"
)

// UDP sends count datagrams of payload from src to dst, with src written
// into the IP header as is, from inside the network namespace at nsPath.
// It returns once the kernel took them all (sent is how many it did).
func UDP(nsPath string, src, dst netip.AddrPort, payload []byte, count int) (sent int, err error) {
	if src.Addr().Is4() != dst.Addr().Is4() {
		return 0, fmt.Errorf("forging %s to %s: the families differ", src, dst)
	}
	pkt := Packet(src, dst, payload)
	// ns.WithNetNSPath runs it on a thread of its own, locked to the
	// namespace.
	err = ns.WithNetNSPath(nsPath, func(ns.NetNS) error {
		var fam int
		var to unix.Sockaddr
		if dst.Addr().Is6() {
			fam, to = unix.AF_INET6, &unix.SockaddrInet6{Addr: dst.Addr().As16()}
		} else {
			fam, to = unix.AF_INET, &unix.SockaddrInet4{Addr: dst.Addr().As4()}
		}
		// IPPROTO_RAW: the caller writes the whole IP header (for IPv6
		// too, since Linux 2.6.24 a raw IPPROTO_RAW socket takes it).
		fd, err := unix.Socket(fam, unix.SOCK_RAW, unix.IPPROTO_RAW)
		if err != nil {
			return fmt.Errorf("opening a raw socket: %w", err)
		}
		defer unix.Close(fd)
		for range count {
			if err := unix.Sendto(fd, pkt, 0, to); err != nil {
				return fmt.Errorf("sending a datagram from %s to %s: %w", src, dst, err)
			}
			sent++
		}
		return nil
	})
	return sent, err
}

// Packet is the IP datagram UDP sends: an IPv4 or IPv6 header from src to
// dst, then UDP with its checksum.
func Packet(src, dst netip.AddrPort, payload []byte) []byte {
	udp := make([]byte, 8+len(payload))
	binary.BigEndian.PutUint16(udp[0:], src.Port())
	binary.BigEndian.PutUint16(udp[2:], dst.Port())
	binary.BigEndian.PutUint16(udp[4:], uint16(len(udp)))
	copy(udp[8:], payload)
	s, d := src.Addr().AsSlice(), dst.Addr().AsSlice()
	// The pseudo-header: addresses, protocol, length.
	sum := checksum(0, s)
	sum = checksum(sum, d)
	sum += uint32(unix.IPPROTO_UDP) + uint32(len(udp))
	c := fold(checksum(sum, udp))
	if c == 0 {
		c = 0xffff
	}
	binary.BigEndian.PutUint16(udp[6:], c)
	if src.Addr().Is6() {
		h := make([]byte, 40)
		h[0] = 6 << 4
		binary.BigEndian.PutUint16(h[4:], uint16(len(udp)))
		h[6], h[7] = unix.IPPROTO_UDP, 64
		copy(h[8:], s)
		copy(h[24:], d)
		return append(h, udp...)
	}
	h := make([]byte, 20)
	h[0] = 4<<4 | 5
	binary.BigEndian.PutUint16(h[2:], uint16(20+len(udp)))
	h[8], h[9] = 64, unix.IPPROTO_UDP
	copy(h[12:], s)
	copy(h[16:], d)
	binary.BigEndian.PutUint16(h[10:], fold(checksum(0, h)))
	return append(h, udp...)
}

func checksum(sum uint32, b []byte) uint32 {
	for i := 0; i+1 < len(b); i += 2 {
		sum += uint32(b[i])<<8 | uint32(b[i+1])
	}
	if len(b)%2 == 1 {
		sum += uint32(b[len(b)-1]) << 8
	}
	return sum
}

func fold(sum uint32) uint16 {
	for sum>>16 != 0 {
		sum = sum&0xffff + sum>>16
	}
	return ^uint16(sum)
}
