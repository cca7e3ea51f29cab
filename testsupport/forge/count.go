package forge

import (
	"fmt"
	"net"
	"net/netip"
	"sync"

	"github.com/containernetworking/plugins/pkg/ns"
)

// Counter counts the UDP datagrams a network namespace receives on a
// port, over both families, by source address: what arrived of a forged
// sender's datagrams, and of the real one's.
type Counter struct {
	mu    sync.Mutex
	from  map[netip.Addr]int
	conns []*net.UDPConn
}

// Listen starts counting what the network namespace at nsPath receives on
// port; Close stops it.
func Listen(nsPath string, port int) (*Counter, error) {
	c := &Counter{from: map[netip.Addr]int{}}
	err := ns.WithNetNSPath(nsPath, func(ns.NetNS) error {
		for _, n := range []string{"udp4", "udp6"} {
			l, err := net.ListenUDP(n, &net.UDPAddr{Port: port})
			if err != nil {
				return err
			}
			c.conns = append(c.conns, l)
		}
		return nil
	})
	if err != nil {
		c.Close()
		return nil, fmt.Errorf("listening on UDP port %d in %s: %w", port, nsPath, err)
	}
	for _, l := range c.conns {
		go func() {
			buf := make([]byte, 256)
			for {
				_, from, err := l.ReadFromUDPAddrPort(buf)
				if err != nil {
					return
				}
				c.mu.Lock()
				c.from[from.Addr().Unmap()]++
				c.mu.Unlock()
			}
		}()
	}
	return c, nil
}

// Count is how many datagrams came from a so far.
func (c *Counter) Count(a netip.Addr) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.from[a]
}

// Close stops counting.
func (c *Counter) Close() {
	for _, l := range c.conns {
		l.Close()
	}
}
