package nl

import (
	"context"
	"errors"
	"fmt"

	vnl "github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"
)

// WatchNftables calls changed after each batch of nftables change
// notifications in the caller's network namespace (the rules iptables-nft
// writes included) until ctx is done. Notifications the kernel had to drop
// (ENOBUFS) count as a change. Reading rules sends none, so a reader that
// only writes what differs does not wake itself for ever.
func WatchNftables(ctx context.Context, subscribed, changed func()) error {
	s, err := vnl.Subscribe(unix.NETLINK_NETFILTER, unix.NFNLGRP_NFTABLES)
	if err != nil {
		return fmt.Errorf("subscribing to nftables changes: %w", err)
	}
	stop := context.AfterFunc(ctx, s.Close)
	defer func() {
		if stop() {
			s.Close()
		}
	}()
	if subscribed != nil {
		subscribed()
	}
	for {
		msgs, _, err := s.Receive()
		switch {
		case ctx.Err() != nil:
			return nil
		case errors.Is(err, unix.ENOBUFS):
			changed()
		case err != nil:
			return fmt.Errorf("receiving nftables changes: %w", err)
		case len(msgs) > 0:
			changed()
		}
	}
}
