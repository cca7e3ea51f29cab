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

// Run reads NFLOG group policy.LogGroup until ctx is done.
func (l *Log) Run(ctx context.Context) error {
	nf, err := nflog.Open(&nflog.Config{Group: policy.LogGroup, Copymode: nflog.CopyPacket, Bufsize: policy.LogSnaplen,
		Flags: nflog.FlagSeq, NetNS: l.NetNS,
		// Batch: up to 64 records, or 50 ms, per message from the kernel.
		QThresh: 64, Timeout: 5})
	if err != nil {
		return fmt.Errorf("opening NFLOG group %d: %w", policy.LogGroup, err)
	}
	defer nf.Close()
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
			if errors.Is(op.Err, unix.ENOBUFS) {
				l.Logger.Debug("verdict log: the kernel dropped records (the socket's buffer was full)")
			}
			return 0
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
		return fmt.Errorf("reading NFLOG group %d: %w", policy.LogGroup, err)
	}
	select {
	case <-ctx.Done():
		return nil
	case err := <-failed:
		return fmt.Errorf("reading NFLOG group %d: %w", policy.LogGroup, err)
	}
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
