package plugin

import (
	"encoding/binary"
	"fmt"
	"net/netip"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"

	"github.com/twill-net/twill/subnet"
)

// cmdStatus reports whether ADD can succeed: 50 (plugin not available) when
// the daemon has not written subnet.env or when the pool has no free address.
func cmdStatus(_ *skel.CmdArgs, c *NetConf) error {
	env, err := subnet.ReadEnv(c.SubnetFile)
	if err != nil {
		return types.NewError(types.ErrPluginNotAvailable, fmt.Sprintf("twill: not ready: %v", err), "")
	}
	if c.IPAM.Type != "" || !env.Subnet.IsValid() {
		return nil
	}
	if em, isENI, err := eniFromEnv(env); isENI && em.Mode == eniModeSecondaryIP {
		if err != nil {
			return types.NewError(types.ErrPluginNotAvailable, err.Error(), "")
		}
		return poolStatus(em.PoolDir)
	}
	first, last, err := hostRange(env.Subnet)
	if err != nil {
		return fmt.Errorf("twill: %w", err)
	}
	capacity := rangeSize(first, last)
	res, err := reservations(c)
	if err != nil {
		return err
	}
	used := 0
	for _, rv := range res {
		if env.Subnet.Contains(rv.IP) {
			used++
		}
	}
	if used >= capacity {
		return types.NewError(types.ErrPluginNotAvailable,
			fmt.Sprintf("twill: no free address in %s (%d of %d in use)", env.Subnet, used, capacity), "")
	}
	return nil
}

// maxRangeSize caps rangeSize: more addresses than pods a node can hold
// are as good as unlimited.
const maxRangeSize = 1 << 24

// rangeSize counts the addresses from first to last (of one family), up to
// maxRangeSize.
func rangeSize(first, last netip.Addr) int {
	if !first.IsValid() || first.BitLen() != last.BitLen() || last.Less(first) {
		return 0
	}
	a, b := first.As16(), last.As16()
	if [12]byte(a[:12]) != [12]byte(b[:12]) {
		return maxRangeSize // they differ above the low 32 bits
	}
	n := uint64(binary.BigEndian.Uint32(b[12:])) - uint64(binary.BigEndian.Uint32(a[12:])) + 1
	return int(min(n, maxRangeSize))
}
