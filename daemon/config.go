package daemon

import (
	"context"
	"errors"
	"time"

	"github.com/twill-net/twill/internal/backoff"
	"github.com/twill-net/twill/network"
	"github.com/twill-net/twill/subnet"
)

func withFamilies(o network.IfaceOptions, cfg *subnet.Config) network.IfaceOptions {
	o.IPv4, o.IPv6 = cfg.EnableIPv4, cfg.EnableIPv6
	return o
}

// networkConfig waits for the configuration, retrying with backoff and a
// clear message: a node may start before the operator has written it.
func (d *Daemon) networkConfig(ctx context.Context) (*subnet.Config, error) {
	bo := backoff.Backoff{Min: 500 * time.Millisecond, Max: 10 * time.Second}
	for {
		// A datastore that does not answer must not hold the daemon
		// silent: each attempt is bounded, and its failure logged.
		actx, cancel := context.WithTimeout(ctx, 10*time.Second)
		cfg, err := d.o.Subnets.NetworkConfig(actx)
		cancel()
		if err == nil {
			return cfg, nil
		}
		if errors.Is(err, subnet.ErrInvalidConfig) {
			// A configuration that is there but wrong will not fix itself
			// by waiting; say so and stop.
			return nil, err
		}
		delay := bo.Next()
		d.log.Warn("waiting for the network configuration", "err", err, "retry_in", delay)
		if !backoff.Sleep(ctx, delay) {
			return nil, nil
		}
	}
}
