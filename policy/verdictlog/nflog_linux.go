package verdictlog

import (
	"context"
	"errors"
	"fmt"
	"time"

	nflog "github.com/florianl/go-nflog/v2"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"

	"github.com/twill-net/twill/policy"
)

// Start binds NFLOG group policy.LogGroup and reads it until ctx is done;
// wait returns then, or when reading fails. An error from Start means the
// group cannot be read at all (no nfnetlink_log in the kernel, or another
// reader holds the group): the table must not log then.
func (l *Log) Start(ctx context.Context) (wait func() error, err error) {
	nf, err := nflog.Open(&nflog.Config{Group: policy.LogGroup, Copymode: nflog.CopyPacket, Bufsize: policy.LogSnaplen,
		Flags: nflog.FlagSeq, NetNS: l.NetNS,
		// Batch: up to 64 records, or 50 ms, per message from the kernel.
		QThresh: 64, Timeout: 5})
	if err != nil {
		return nil, fmt.Errorf("opening NFLOG group %d: %w", policy.LogGroup, err)
	}
	// A bigger receive buffer rides out bursts; past it the kernel drops
	// records, which the sequence numbers show.
	_ = nf.Con.SetReadBuffer(4 << 20)
	failed := make(chan error, 1)
	err = nf.RegisterWithErrorFunc(ctx, func(a nflog.Attribute) int {
		l.take(a)
		return 0
	}, func(err error) int {
		var op *netlink.OpError
		if errors.As(err, &op) && (op.Timeout() || errors.Is(op.Err, unix.ENOBUFS)) {
			return 0 // ENOBUFS: the kernel dropped records; the sequence counts them
		}
		if ctx.Err() == nil {
			select {
			case failed <- err:
			default:
			}
		}
		return 1
	})
	if err != nil {
		nf.Close()
		return nil, fmt.Errorf("binding NFLOG group %d: %w", policy.LogGroup, err)
	}
	return func() error {
		defer nf.Close()
		select {
		case <-ctx.Done():
			return nil
		case err := <-failed:
			return fmt.Errorf("reading NFLOG group %d: %w", policy.LogGroup, err)
		}
	}, nil
}

// take keeps one record, counting the gap in NFLOG's sequence before it
// as lost.
func (l *Log) take(a nflog.Attribute) {
	if a.Seq != nil {
		if l.seenSeq && *a.Seq != l.lastSeq+1 {
			l.lost.Add(uint64(*a.Seq - l.lastSeq - 1))
		}
		l.lastSeq, l.seenSeq = *a.Seq, true
	}
	if a.Payload == nil || a.Prefix == nil {
		l.lost.Add(1)
		return
	}
	at := time.Now()
	if a.Timestamp != nil {
		at = *a.Timestamp
	}
	l.Add(*a.Prefix, *a.Payload, at)
}
