package nl

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"strings"
	"syscall"

	vnl "github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"
)

// WatchNftables calls changed after each batch of nftables change
// notifications in the caller's network namespace (the rules iptables-nft
// writes included) until ctx is done. Notifications the kernel had to drop
// (ENOBUFS) count as a change. Reading rules sends none, so a reader that
// only writes what differs does not wake itself for ever.
func WatchNftables(ctx context.Context, subscribed, changed func()) error {
	return watchNftables(ctx, subscribed, func(msgs []syscall.NetlinkMessage, lost bool) {
		if lost || len(msgs) > 0 {
			changed()
		}
	})
}

// watchNftables subscribes to nftables change notifications, calls
// subscribed, then got with each batch received (lost: the kernel dropped
// some, ENOBUFS) until ctx is done.
func watchNftables(ctx context.Context, subscribed func(), got func(msgs []syscall.NetlinkMessage, lost bool)) error {
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
			got(nil, true)
		case err != nil:
			return fmt.Errorf("receiving nftables changes: %w", err)
		default:
			got(msgs, false)
		}
	}
}

// WatchNftablesTable calls changed after each batch of nftables changes
// that touches table (in any family) and that another program made (by
// its name: a PID does not cross PID namespaces, and twilld runs in a
// container), until ctx is done: a writer of its own table sees others' changes (drift), not
// its own, and not every other table's (kube-proxy's). Lost notifications
// (ENOBUFS) count as a change.
func WatchNftablesTable(ctx context.Context, table string, subscribed, changed func()) error {
	touched := false // by the batch under way
	self := ownComm()
	return watchNftables(ctx, subscribed, func(msgs []syscall.NetlinkMessage, lost bool) {
		if lost {
			touched = false
			changed()
			return
		}
		for _, m := range msgs {
			name, comm, gen := nftMessage(m.Header.Type, m.Data)
			switch {
			case gen:
				if touched && comm != self {
					changed()
				}
				touched = false
			case name == table:
				touched = true
			}
		}
	})
}

// ownComm is this program's name as the kernel gives it (comm, at most 15
// bytes).
func ownComm() string {
	b, err := os.ReadFile("/proc/self/comm")
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

// nftMessage reads an nftables notification: the table it names (its
// first attribute, in every table, chain, rule, set and element message),
// or, for the batch's closing generation message, the writer's name.
func nftMessage(typ uint16, data []byte) (table, comm string, gen bool) {
	if len(data) < 4 || typ>>8 != unix.NFNL_SUBSYS_NFTABLES {
		return "", "", false
	}
	attrs, err := vnl.ParseRouteAttr(data[4:])
	if err != nil {
		return "", "", false
	}
	msg := typ & 0xff
	for _, a := range attrs {
		switch {
		case msg == unix.NFT_MSG_NEWGEN && a.Attr.Type&^unix.NLA_F_NESTED == unix.NFTA_GEN_PROC_NAME:
			comm = strings.TrimRight(string(a.Value), "\x00")
		case msg != unix.NFT_MSG_NEWGEN && a.Attr.Type&^unix.NLA_F_NESTED == 1: // NFTA_{TABLE_NAME,CHAIN,RULE,SET,SET_ELEM_LIST}_TABLE
			return strings.TrimRight(string(a.Value), "\x00"), "", false
		}
	}
	return "", comm, msg == unix.NFT_MSG_NEWGEN
}

// NftGeneration reads nftables' generation in the caller's network
// namespace: the kernel moves it with every transaction it commits, of any
// table and any writer (nft, iptables-nft, twill). Reading it changes
// nothing, sends no notification and spawns no process.
func NftGeneration() (uint32, error) {
	req := vnl.NewNetlinkRequest(unix.NFNL_SUBSYS_NFTABLES<<8|unix.NFT_MSG_GETGEN, 0)
	req.AddData(nfgenmsg{})
	msgs, err := req.Execute(unix.NETLINK_NETFILTER, unix.NFNL_SUBSYS_NFTABLES<<8|unix.NFT_MSG_NEWGEN)
	if err != nil {
		return 0, fmt.Errorf("reading nftables' generation: %w", err)
	}
	for _, m := range msgs {
		if len(m) < 4 {
			continue
		}
		attrs, err := vnl.ParseRouteAttr(m[4:])
		if err != nil {
			return 0, fmt.Errorf("reading nftables' generation: %w", err)
		}
		for _, a := range attrs {
			if a.Attr.Type&^unix.NLA_F_NESTED == unix.NFTA_GEN_ID && len(a.Value) == 4 {
				return binary.BigEndian.Uint32(a.Value), nil
			}
		}
	}
	return 0, errors.New("reading nftables' generation: no generation in the kernel's answer")
}

// nfgenmsg is nfnetlink's header: family (unspecified), version 0,
// resource 0.
type nfgenmsg struct{}

func (nfgenmsg) Len() int { return 4 }

func (nfgenmsg) Serialize() []byte { return []byte{unix.AF_UNSPEC, unix.NFNETLINK_V0, 0, 0} }
