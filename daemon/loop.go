package daemon

import (
	"context"
	"errors"
	"time"

	"github.com/twill-net/twill/backend"
	"github.com/twill-net/twill/internal/backoff"
	"github.com/twill-net/twill/subnet"
)

// publish folds a change of the leases in and pokes the loop; it never
// blocks.
func (d *Daemon) publish(c subnet.Change) {
	d.peers.apply(c)
	d.signal()
}

func (d *Daemon) signal() {
	select {
	case d.poke <- struct{}{}:
	default:
	}
}

// requestFull asks for a full reconcile: the kernel changed behind the
// backend's back.
func (d *Daemon) requestFull() {
	d.fullDue.Store(true)
	d.signal()
}

func (d *Daemon) reconcileLoop(ctx context.Context, cfg *subnet.Config, local subnet.Lease, nw backend.Attached) error {
	tick := time.NewTicker(d.o.Resync)
	defer tick.Stop()
	var (
		retry    *time.Timer
		retryC   <-chan time.Time
		bo       = backoff.Backoff{Min: 200 * time.Millisecond, Max: 30 * time.Second}
		lastFull time.Time
	)
	for {
		d.heartbeat.Store(time.Now().UnixNano())
		select {
		case <-ctx.Done():
			return nil
		case <-d.poke:
		case <-tick.C:
			if d.fullResyncDue(lastFull) {
				d.fullDue.Store(true)
			}
		case <-retryC:
			d.fullDue.Store(true)
		}
		have, changedAll := d.peers.ready()
		if !have {
			continue // never reconcile before the first listing: it would delete every route
		}
		if d.ext.dirty.Swap(false) {
			d.refreshExternal(nw)
			d.fullDue.Store(true)
		}
		start := time.Now()
		full, err := d.reconcileOnce(ctx, cfg, local, nw, changedAll)
		if perr := d.publishData(ctx, nw); perr != nil {
			err = errors.Join(err, perr)
		}
		took := time.Since(start)
		peers, refused := d.peers.count()
		d.metrics.reconcileDuration.Observe(took.Seconds())
		d.metrics.leases.Set(float64(peers))
		d.metrics.refused.Set(float64(refused))
		d.log.Debug("reconciled", "full", full, "peers", peers, "took", took)
		if err != nil {
			d.metrics.reconcileErrors.Inc()
			retryDelay := bo.Next()
			d.log.Warn("reconcile failed; retrying", "err", err, "retry_in", retryDelay)
			if retry != nil {
				retry.Stop()
			}
			retry = time.NewTimer(retryDelay)
			retryC = retry.C
			continue
		}
		bo.Reset()
		retryC = nil
		if full {
			lastFull = start
		}
		if !d.ready.Load() {
			if err := d.becomeReady(ctx); err != nil {
				if ctx.Err() != nil {
					return nil // stopped while becoming ready: a stop, not a failure
				}
				return err
			}
			d.log.Info("ready", "peers", peers, "took_reconcile", took.Round(time.Millisecond), "since_start", time.Since(d.started).Round(time.Millisecond))
		}
	}
}

// fullResyncDue says whether a tick of the loop, every Resync, is a full
// reconcile's: each one is until the kernel watches run, then one every
// WatchedResync (the watches ask for one when they see drift).
func (d *Daemon) fullResyncDue(lastFull time.Time) bool {
	return !d.watched.Load() || time.Since(lastFull) >= d.watchedSyncEvery()
}

// watchedSyncEvery is how long a backend whose kernel watch runs may
// trust its record of the kernel: the period of fullResyncDue, so that
// each watched full reconcile reads the kernel back, and a lease event
// between two of them does not. (The record trusted for Resync alone,
// the first lease event after Resync of quiet read every object back:
// tens of milliseconds at 50,000 peers.)
func (d *Daemon) watchedSyncEvery() time.Duration {
	return d.o.WatchedResync - d.o.Resync/2
}

// reconcileOnce hands the backend what changed since the last time when
// it can take that (backend.Updater), and every peer otherwise: at the
// first turn, after a full set arrived, on a resync, a retry or drift. It
// reports whether it was a full reconcile.
func (d *Daemon) reconcileOnce(ctx context.Context, cfg *subnet.Config, local subnet.Lease, nw backend.Attached, changedAll bool) (bool, error) {
	if nw.Updater != nil && d.ready.Load() && !changedAll && !d.fullDue.Load() {
		upserted, removed := d.peers.delta(cfg, local)
		if len(upserted)+len(removed) == 0 {
			return false, nil
		}
		err := nw.Updater.Update(ctx, upserted, removed)
		if !errors.Is(err, backend.ErrFullReconcile) {
			if err != nil {
				d.fullDue.Store(true) // the retry starts from the whole state
			}
			return false, err
		}
	}
	d.fullDue.Store(false)
	return true, nw.Network.Reconcile(ctx, d.peers.all(cfg, local))
}

// kernelWatchWait bounds how long readiness waits for the kernel watch's
// first check.
const kernelWatchWait = 10 * time.Second

// awaitKernelWatch waits until the kernel watches (the backend's, and the
// external interface's link and address watches) have made their first
// check: the backend's reads every object twill programmed (three dumps of
// 50,000 with vxlan), which is start-up's work, not the first lease
// events'. A watch
// that cannot subscribe does not hold the node back for long: it keeps
// trying, and the periodic full reconcile repairs drift meanwhile.
func (d *Daemon) awaitKernelWatch(ctx context.Context, watching <-chan struct{}) error {
	t := time.NewTimer(kernelWatchWait)
	defer t.Stop()
	select {
	case <-watching:
		d.log.Debug("kernel watch checked", "since_start", time.Since(d.started))
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		d.log.Warn("the kernel watch has not started; ready without it (it keeps trying, and every --resync repairs drift meanwhile)", "waited", kernelWatchWait)
	}
	return nil
}

// becomeReady runs what waits for the first reconcile and tells the subnet
// manager the node is ready.
func (d *Daemon) becomeReady(ctx context.Context) error {
	if d.afterFirstReconcile != nil {
		if err := d.afterFirstReconcile(); err != nil {
			return err
		}
	}
	if r := d.o.Subnets.Ready; r != nil {
		if err := r.Ready(ctx); err != nil {
			return err
		}
	}
	d.ready.Store(true)
	return nil
}
