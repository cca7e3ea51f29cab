package daemon

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/twill-net/twill/backend"
	"github.com/twill-net/twill/backend/kernelsync"
	"github.com/twill-net/twill/internal/desiredfile"
	"github.com/twill-net/twill/network"
	"github.com/twill-net/twill/network/netfilter"
	"github.com/twill-net/twill/subnet"
)

// setUpNode enables forwarding, installs the netfilter rules in the mode
// chosen and writes subnet.env (pods are wired only once masquerading is
// in place), returning what keeps the last two in place.
func (d *Daemon) setUpNode(cfg *subnet.Config, lease subnet.Lease, nw backend.Attached) (Runner, *desiredfile.Keeper, error) {
	env := subnet.Env{MTU: nw.Network.MTU(), IPMasq: d.o.IPMasq, Backend: cfg.BackendType}
	if nw.Env != nil {
		env.Extra = nw.Env.Env()
	}
	o := netfilter.Options{Logger: d.log, IPMasq: d.o.IPMasq, Resync: d.o.IPTablesResync, WatchedResync: d.o.WatchedResync,
		Repaired: func() { d.metrics.driftRepairs.Inc() }}
	if cfg.EnableIPv4 {
		o.Networks = append(o.Networks, network.NetworkPair{Cluster: cfg.Network, Local: lease.Subnet})
		env.Network, env.Subnet = cfg.Network, lease.Subnet
	}
	if cfg.EnableIPv6 && lease.IPv6Subnet.IsValid() {
		o.Networks = append(o.Networks, network.NetworkPair{Cluster: cfg.IPv6Network, Local: lease.IPv6Subnet})
		env.IPv6Network, env.IPv6Subnet = cfg.IPv6Network, lease.IPv6Subnet
	}
	node := d.o.Node
	if node == nil {
		node = systemNode{mode: d.o.Netfilter}
	}
	mode, keeper, err := node.SetUp(cfg, o)
	if err != nil {
		return nil, nil, err
	}
	env.Netfilter = string(mode)
	// subnet.env is desired state like a route: deleted or altered, it is
	// written again at once.
	envFile := &desiredfile.Keeper{Path: d.o.SubnetFile, Logger: d.log, Repaired: func() { d.metrics.driftRepairs.Inc() }}
	if err := envFile.Set(env.Marshal()); err != nil {
		return nil, nil, err
	}
	return keeper, envFile, nil
}

// afterReady is what runs once the first reconcile is done: it waits for
// the node's setup, then starts the kernel watch, the external interface
// watch, the reclaiming of leaked addresses and the CNI conflist (a node
// takes pods only once it routes).
func (d *Daemon) afterReady(ctx context.Context, g *errgroup.Group, cfg *subnet.Config, nw backend.Attached, setUp <-chan error, policySynced <-chan struct{}) func() error {
	steps := []func() error{func() error {
		select {
		case err := <-setUp:
			if err == nil && d.o.StartedUp != nil {
				d.o.StartedUp()
				d.log.Debug("start-up hook done", "since_start", time.Since(d.started))
			}
			return err
		case <-ctx.Done():
			return ctx.Err()
		}
	}}
	// Ready waits for the kernel watches: a change before a watch
	// subscribed is noticed by its first check, but a link that went down
	// and up again before the external interface's watch began looks
	// unchanged, and the kernel flushed its routes without a word.
	watching := make(chan struct{})
	w := nw.Watcher
	isWatcher := w != nil
	checked := kernelsync.AllChecked(1+btoi(isWatcher), sync.OnceFunc(func() {
		// Only a backend that watches its own objects lets the safety net
		// run less often.
		d.watched.Store(isWatcher)
		close(watching)
	}))
	if isWatcher {
		// Watching starts after the first reconcile, so that the watcher
		// does not decode thousands of events about our own initial
		// programming. Once subscribed it checks the kernel against the
		// record and pokes if they differ: nothing that changed before the
		// subscription goes unnoticed.
		steps = append(steps, func() error { g.Go(func() error { return w.WatchKernel(ctx, d.requestFull, checked[1]) }); return nil })
	}
	if d.o.Allocations.Dir != "" && d.o.Allocations.Every > 0 {
		steps = append(steps, func() error { g.Go(func() error { return d.reclaimLoop(ctx) }); return nil })
	}
	// A pod must never start on a node whose policy is not yet enforced.
	steps = append(steps, func() error {
		select {
		case <-policySynced:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	})
	if d.o.CNIConflistPath != "" {
		conflist := &desiredfile.Keeper{Path: d.o.CNIConflistPath, Logger: d.log, Repaired: func() { d.metrics.driftRepairs.Inc() }}
		steps = append(steps, func() error {
			if err := conflist.Set(d.o.CNIConflist); err != nil {
				return fmt.Errorf("installing the CNI conflist: %w", err)
			}
			d.log.Info("installed the CNI conflist", "path", d.o.CNIConflistPath)
			g.Go(func() error { return conflist.Run(ctx) })
			return nil
		})
	}
	steps = append(steps, func() error { g.Go(func() error { return d.watchExternal(ctx, checked[0]) }); return nil })
	// What flannel left goes once twill's routes and rules are in place.
	steps = append(steps, func() error { g.Go(func() error { return d.takeOver(cfg).Run(ctx) }); return nil })
	steps = append(steps, func() error { return d.awaitKernelWatch(ctx, watching) })
	return func() error {
		for _, f := range steps {
			if err := f(); err != nil {
				return err
			}
		}
		return nil
	}
}

// publishData publishes the backend's new data in the node's lease, when it
// has some; a failure is retried with the next reconcile.
func (d *Daemon) publishData(ctx context.Context, nw backend.Attached) error {
	if d.pendingData == nil {
		if nw.Data == nil {
			return nil
		}
		data, v6Data, changed := nw.Data.BackendData()
		if !changed {
			return nil
		}
		d.pendingData = &[2]json.RawMessage{data, v6Data}
	}
	if err := d.o.Subnets.DataUpdater.UpdateBackendData(ctx, d.pendingData[0], d.pendingData[1]); err != nil {
		return fmt.Errorf("publishing the backend's new data: %w", err)
	}
	d.log.Info("published new backend data in this node's lease", "data", string(d.pendingData[0]), "v6_data", string(d.pendingData[1]))
	d.pendingData = nil
	return nil
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}
