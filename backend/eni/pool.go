package eni

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/containernetworking/plugins/plugins/ipam/host-local/backend/disk"

	enicni "github.com/twill-net/twill/backend/eni/cni"
	"github.com/twill-net/twill/internal/tick"
)

// Pool keeps PoolLowWater..PoolHighWater free secondary IPs on the ENI.
type Pool struct {
	Dir       string
	Provider  Provider
	ENI       ENI
	Log       *slog.Logger
	LowWater  int
	HighWater int
	Cooldown  time.Duration
	// Every is the check period (default 200ms).
	Every time.Duration

	// Used by Init, then only by Run's goroutine.
	assigned     []netip.Addr
	exhausted    string
	lastTry      time.Time
	surplusSince time.Time
}

// Init creates the directory and publishes the ENI's current secondary IPs.
func (p *Pool) Init() error {
	if p.Every <= 0 {
		p.Every = 200 * time.Millisecond
	}
	if err := os.MkdirAll(filepath.Join(p.Dir, enicni.PoolStoreName), 0o755); err != nil {
		return fmt.Errorf("eni: pool: %w", err)
	}
	p.assigned = slices.Clone(p.ENI.SecondaryIPs)
	return p.publish()
}

func (p *Pool) lock() (*disk.Store, error) {
	s, err := disk.New(enicni.PoolStoreName, p.Dir)
	if err != nil {
		return nil, err
	}
	if err := s.Lock(); err != nil {
		s.Close()
		return nil, err
	}
	return s, nil
}

func (p *Pool) publish() error {
	s, err := p.lock()
	if err != nil {
		return fmt.Errorf("eni: pool: %w", err)
	}
	defer func() { s.Unlock(); s.Close() }()
	return enicni.WritePoolFile(p.Dir, enicni.PoolFile{ENI: p.ENI.ID, IPs: p.assigned, Exhausted: p.exhausted})
}

// Run checks the pool every Every until ctx ends. Provider errors are
// logged and retried; they never stop the daemon.
func (p *Pool) Run(ctx context.Context) error {
	var backoffUntil time.Time
	return tick.Every(ctx, p.Every, func() {
		if time.Now().Before(backoffUntil) {
			return
		}
		if err := p.Step(ctx); err != nil {
			p.Log.Warn("warm pool: provider call failed; retrying", "err", err)
			backoffUntil = time.Now().Add(2 * time.Second)
		}
	})
}

// Step makes one check: grow below the low water mark, release surplus
// that outlasted the cooldown.
func (p *Pool) Step(ctx context.Context) error {
	used, err := enicni.PoolInUse(p.Dir)
	if err != nil {
		return err
	}
	var free []netip.Addr
	for _, ip := range p.assigned {
		if !used[ip] {
			free = append(free, ip)
		}
	}
	switch {
	case len(free) < p.LowWater:
		p.surplusSince = time.Time{}
		if p.exhausted != "" && time.Since(p.lastTry) < 10*time.Second {
			return nil // the limit will not move by itself; do not hammer the API
		}
		p.lastTry = time.Now()
		want := p.HighWater - len(free)
		eni, err := p.Provider.AssignIPs(ctx, p.ENI.ID, want)
		grown := len(eni.SecondaryIPs) > len(p.assigned)
		if grown {
			p.Log.Info("warm pool: assigned secondary IPs", "eni", p.ENI.ID, "added", len(eni.SecondaryIPs)-len(p.assigned), "free_before", len(free), "in_use", len(used))
			p.assigned = eni.SecondaryIPs
		}
		reason := ""
		if errors.Is(err, ErrLimitExceeded) || errors.Is(err, ErrSubnetFull) {
			reason = err.Error()
			err = nil
		}
		if reason != p.exhausted || grown {
			if reason != "" && reason != p.exhausted {
				p.Log.Warn("warm pool: cannot grow", "eni", p.ENI.ID, "reason", reason, "assigned", len(p.assigned), "in_use", len(used))
			}
			p.exhausted = reason
			if perr := p.publish(); perr != nil {
				return perr
			}
		}
		return err
	case len(free) > p.HighWater:
		if p.surplusSince.IsZero() {
			p.surplusSince = time.Now()
			return nil
		}
		if time.Since(p.surplusSince) < p.Cooldown {
			return nil
		}
		p.surplusSince = time.Time{}
		return p.release(ctx, free[p.HighWater:])
	default:
		p.surplusSince = time.Time{}
		return nil
	}
}

// release withdraws IPs from pool.json under the store lock (re-checking
// they are still free), then has the provider unassign them.
func (p *Pool) release(ctx context.Context, candidates []netip.Addr) error {
	s, err := p.lock()
	if err != nil {
		return err
	}
	used, err := enicni.PoolInUse(p.Dir)
	if err != nil {
		s.Unlock()
		s.Close()
		return err
	}
	var gone []netip.Addr
	keep := p.assigned[:0:0]
	for _, ip := range p.assigned {
		if slices.Contains(candidates, ip) && !used[ip] {
			gone = append(gone, ip)
			continue
		}
		keep = append(keep, ip)
	}
	err = enicni.WritePoolFile(p.Dir, enicni.PoolFile{ENI: p.ENI.ID, IPs: keep, Exhausted: ""})
	s.Unlock()
	s.Close()
	if err != nil {
		return err
	}
	if err := p.Provider.UnassignIPs(ctx, p.ENI.ID, gone); err != nil {
		if errors.Is(err, ErrNotSupported) {
			p.Log.Info("warm pool: the provider keeps its IPs; not releasing surplus", "eni", p.ENI.ID)
			p.Cooldown = 1<<63 - 1
			return p.publish()
		}
		// Still assigned in the cloud: offer them to pods again.
		_ = p.publish()
		return err
	}
	p.assigned, p.exhausted = keep, ""
	p.Log.Info("warm pool: released surplus secondary IPs", "eni", p.ENI.ID, "released", len(gone), "free", len(keep)-len(used))
	return nil
}
