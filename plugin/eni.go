package plugin

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/cni/pkg/version"
	"github.com/containernetworking/plugins/plugins/ipam/host-local/backend/disk"

	eni "github.com/twill-net/twill/backend/eni/cni"
	"github.com/twill-net/twill/nl"
	"github.com/twill-net/twill/plugin/allocations"
	"github.com/twill-net/twill/subnet"
)

// eniMode is what subnet.env says about the eni backend, when it is in use.
type eniMode struct {
	Mode           string
	Table          int
	ToPod, FromPod int
	PoolDir        string
}

func eniFromEnv(env subnet.Env) (eniMode, bool, error) {
	mode := env.Extra[eni.EnvMode]
	if mode == "" {
		return eniMode{}, false, nil
	}
	m := eniMode{Mode: mode, PoolDir: env.Extra[eni.EnvPoolDir]}
	for _, f := range []struct {
		key string
		dst *int
	}{{eni.EnvTable, &m.Table}, {eni.EnvRuleToPod, &m.ToPod}, {eni.EnvRuleFromPod, &m.FromPod}} {
		v, err := strconv.Atoi(env.Extra[f.key])
		if err != nil || v <= 0 {
			return m, true, fmt.Errorf("twill: subnet.env TWILL_%s %q: not a positive number", f.key, env.Extra[f.key])
		}
		*f.dst = v
	}
	if m.Mode == eni.ModeSecondaryIP && m.PoolDir == "" {
		return m, true, fmt.Errorf("twill: subnet.env TWILL_%s is empty in secondary-ip mode", eni.EnvPoolDir)
	}
	return m, true, nil
}

// podRules are the two policy rules of one pod address.
func (m eniMode) podRules(ip netip.Addr) []nl.Rule {
	p := hostPrefix(ip)
	return []nl.Rule{
		{Priority: m.ToPod, Dst: p, Table: nl.MainTable, Protocol: nl.PodRouteProtocol},
		{Priority: m.FromPod, Src: p, Table: m.Table, Protocol: nl.PodRouteProtocol},
	}
}

// deletePodRules removes every rule twill's plugin made for ip, whatever
// its priority or table: DEL finds rules by pod address, so it cleans up
// even when subnet.env is gone or its settings changed.
func deletePodRules(h *nl.Handle, ips []netip.Addr) error {
	if len(ips) == 0 {
		return nil
	}
	rules, err := h.Rules(nl.FamilyV4)
	if err != nil {
		return fmt.Errorf("twill: %w", err)
	}
	var errs []error
	for _, r := range rules {
		if r.Protocol != nl.PodRouteProtocol {
			continue
		}
		for _, ip := range ips {
			if r.Src == hostPrefix(ip) || r.Dst == hostPrefix(ip) {
				if err := h.RuleDel(r); err != nil {
					errs = append(errs, fmt.Errorf("twill: %w", err))
				}
			}
		}
	}
	return errors.Join(errs...)
}

// poolWait bounds how long ADD waits for the daemon to grow the warm pool.
const poolWait = 5 * time.Second

// allocateFromPool reserves one of the ENI's secondary IPs from the warm
// pool the daemon keeps. With none free it waits (bounded) for the daemon
// to assign more, and fails at once when the daemon says it cannot.
func allocateFromPool(dir, containerID, ifName string) (netip.Addr, error) {
	deadline := time.Now().Add(poolWait)
	for {
		ip, pool, err := tryPool(dir, containerID, ifName)
		if err != nil || ip.IsValid() {
			return ip, err
		}
		if pool.Exhausted != "" {
			return netip.Addr{}, fmt.Errorf("twill: no free secondary IP on ENI %s (%d assigned, all in use), and the pool cannot grow: %s",
				pool.ENI, len(pool.IPs), pool.Exhausted)
		}
		if time.Now().After(deadline) {
			return netip.Addr{}, fmt.Errorf("twill: no free secondary IP on ENI %s after waiting %s for the warm pool to grow (%d assigned, all in use); is twilld running?",
				pool.ENI, poolWait, len(pool.IPs))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func tryPool(dir, containerID, ifName string) (netip.Addr, eni.PoolFile, error) {
	s, err := disk.New(eni.PoolStoreName, dir)
	if err != nil {
		return netip.Addr{}, eni.PoolFile{}, fmt.Errorf("twill: warm pool %s: %w", dir, err)
	}
	defer s.Close()
	if err := s.Lock(); err != nil {
		return netip.Addr{}, eni.PoolFile{}, fmt.Errorf("twill: locking the warm pool: %w", err)
	}
	defer s.Unlock()
	pool, err := eni.ReadPoolFile(dir)
	if err != nil {
		return netip.Addr{}, pool, fmt.Errorf("twill: warm pool: %w", err)
	}
	if have := s.GetByID(containerID, ifName); len(have) > 0 {
		a, _ := netip.AddrFromSlice(have[0])
		return a.Unmap(), pool, nil
	}
	for _, ip := range pool.IPs {
		ok, err := s.Reserve(containerID, ifName, net.IP(ip.AsSlice()), "0")
		if err != nil {
			return netip.Addr{}, pool, fmt.Errorf("twill: reserving %s: %w", ip, err)
		}
		if ok {
			return ip, pool, nil
		}
	}
	return netip.Addr{}, pool, nil
}

// poolRelease frees the attachment's pool IP and returns it.
func poolRelease(dir, containerID, ifName string) ([]netip.Addr, error) {
	if _, err := os.Stat(dir); err != nil {
		return nil, nil
	}
	s, err := disk.New(eni.PoolStoreName, dir)
	if err != nil {
		return nil, fmt.Errorf("twill: warm pool %s: %w", dir, err)
	}
	defer s.Close()
	if err := s.Lock(); err != nil {
		return nil, fmt.Errorf("twill: locking the warm pool: %w", err)
	}
	defer s.Unlock()
	var ips []netip.Addr
	for _, ip := range s.GetByID(containerID, ifName) {
		a, _ := netip.AddrFromSlice(ip)
		ips = append(ips, a.Unmap())
	}
	if err := s.ReleaseByID(containerID, ifName); err != nil {
		return ips, fmt.Errorf("twill: releasing %s/%s from the warm pool: %w", containerID, ifName, err)
	}
	return ips, nil
}

const eniModeSecondaryIP = eni.ModeSecondaryIP

// prevIPs are the addresses in the request's prevResult, if any.
func prevIPs(c *NetConf) []netip.Addr {
	if c.RawPrevResult == nil {
		return nil
	}
	if err := version.ParsePrevResult(&c.NetConf); err != nil {
		return nil
	}
	prev, err := current.NewResultFromResult(c.PrevResult)
	if err != nil {
		return nil
	}
	var ips []netip.Addr
	for _, ipc := range prev.IPs {
		if a, ok := netip.AddrFromSlice(ipc.Address.IP); ok {
			ips = append(ips, a.Unmap())
		}
	}
	return ips
}

// poolStale lists warm-pool reservations of attachments the runtime no
// longer has. The caller removes their files, veths and rules; the pool
// lock is not needed to delete a reservation file.
func poolStale(dir string, valid map[types.GCAttachment]bool) ([]reservation, error) {
	res, err := allocations.Records(filepath.Join(dir, eni.PoolStoreName))
	if err != nil {
		return nil, err
	}
	var stale []reservation
	for _, rv := range res {
		if !valid[types.GCAttachment{ContainerID: rv.ContainerID, IfName: rv.IfName}] {
			stale = append(stale, rv)
		}
	}
	return stale, nil
}

// poolStatus fails with code 50 when the warm pool has no free IP and says
// it cannot grow; a pool that is merely empty will be refilled by twilld.
func poolStatus(dir string) error {
	pool, err := eni.ReadPoolFile(dir)
	if err != nil {
		return types.NewError(types.ErrPluginNotAvailable, fmt.Sprintf("twill: warm pool: %v", err), "")
	}
	used, err := eni.PoolInUse(dir)
	if err != nil {
		return types.NewError(types.ErrPluginNotAvailable, fmt.Sprintf("twill: warm pool: %v", err), "")
	}
	free := 0
	for _, ip := range pool.IPs {
		if !used[ip] {
			free++
		}
	}
	if free == 0 && pool.Exhausted != "" {
		return types.NewError(types.ErrPluginNotAvailable,
			fmt.Sprintf("twill: no free secondary IP on ENI %s and the pool cannot grow: %s", pool.ENI, pool.Exhausted), "")
	}
	return nil
}
