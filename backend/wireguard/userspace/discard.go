package userspace

import (
	"net"
	"net/netip"
	"sync"

	"golang.zx2c4.com/wireguard/conn"
)

// DiscardBind is a conn.Bind that sends nothing and receives nothing: a
// device run with it is configured and read back like any other but never
// touches a network (the unit tests run it on the machine's own).
type DiscardBind struct {
	mu     sync.Mutex
	closed chan struct{} // guarded by mu
}

var _ conn.Bind = (*DiscardBind)(nil)

// Open returns one receive function, which blocks until Close.
func (b *DiscardBind) Open(port uint16) ([]conn.ReceiveFunc, uint16, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	closed := make(chan struct{})
	b.closed = closed
	return []conn.ReceiveFunc{func([][]byte, []int, []conn.Endpoint) (int, error) {
		<-closed
		return 0, net.ErrClosed
	}}, port, nil
}

// Close unblocks the receive function.
func (b *DiscardBind) Close() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed != nil {
		close(b.closed)
		b.closed = nil
	}
	return nil
}

// SetMark does nothing.
func (b *DiscardBind) SetMark(uint32) error { return nil }

// Send drops the packets.
func (b *DiscardBind) Send([][]byte, conn.Endpoint) error { return nil }

// ParseEndpoint keeps the address, so that the device reports it back.
func (b *DiscardBind) ParseEndpoint(s string) (conn.Endpoint, error) {
	ap, err := netip.ParseAddrPort(s)
	if err != nil {
		return nil, err
	}
	return &conn.StdNetEndpoint{AddrPort: ap}, nil
}

// BatchSize is one.
func (b *DiscardBind) BatchSize() int { return 1 }
