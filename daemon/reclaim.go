package daemon

import (
	"context"
	"os"
	"path/filepath"
	"time"

	"github.com/twill-net/twill/internal/tick"
	"github.com/twill-net/twill/plugin/allocations"
	"github.com/twill-net/twill/takeover"
)

// AllocationsOptions locate the CNI plugin's allocation store.
type AllocationsOptions struct {
	// Dir is <dataDir>/<network>, as in the plugin's configuration.
	Dir string
	// Every is the period of the check; 0 disables it.
	Every time.Duration
}

// reclaimLoop releases, every Every, the allocations whose pods are gone.
// The plugin does the same when its subnet runs full; doing it here too
// keeps the pool honest on nodes whose runtime never calls CNI GC.
func (d *Daemon) reclaimLoop(ctx context.Context) error {
	return tick.Every(ctx, d.o.Allocations.Every, d.reclaim)
}

func (d *Daemon) reclaim() {
	dir := d.o.Allocations.Dir
	if _, err := os.Stat(dir); err != nil {
		return // no pod wired on this node yet
	}
	if ok, _ := d.o.Netlink.LinkExists(takeover.DefaultBridge); ok {
		// A node switched from flannel shares flannel's store: its pods
		// on the bridge have no twill veth, yet are not gone.
		return
	}
	unlock, err := allocations.Store(filepath.Dir(dir), filepath.Base(dir))
	if err != nil {
		d.log.Warn("reclaiming addresses of pods that are gone", "err", err)
		return
	}
	gone, err := allocations.Reclaim(dir, allocations.Grace, time.Now(), d.o.Netlink.LinkExists)
	unlock()
	if err != nil {
		d.log.Warn("reclaiming addresses of pods that are gone", "dir", dir, "err", err)
	}
	if len(gone) == 0 {
		return
	}
	d.metrics.reclaimed.Add(float64(len(gone)))
	ips := make([]string, 0, min(len(gone), 5))
	for _, r := range gone[:min(len(gone), 5)] {
		ips = append(ips, r.IP.String())
	}
	d.log.Info("released addresses whose pods are gone (their CNI DEL never came)", "count", len(gone), "dir", dir, "addresses", ips)
}
