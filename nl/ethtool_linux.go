package nl

import (
	"fmt"

	"github.com/safchain/ethtool"
)

// FeatureTXChecksum is ethtool's name for a device computing the checksums
// of what it sends on the way out (or leaving them to hardware) rather than
// having the stack fill them in: `ethtool -k DEV`'s tx-checksum-ip-generic.
// Turning it off also turns off segmentation offload, which needs it.
const FeatureTXChecksum = "tx-checksum-ip-generic"

// TXChecksum reports whether the named link has FeatureTXChecksum on.
func (h *Handle) TXChecksum(name string) (bool, error) {
	var on bool
	err := h.withEthtool(func(e *ethtool.Ethtool) error {
		f, err := e.Features(name)
		if err != nil {
			return err
		}
		v, ok := f[FeatureTXChecksum]
		if !ok {
			return fmt.Errorf("the device has no %s feature", FeatureTXChecksum)
		}
		on = v
		return nil
	})
	if err != nil {
		return false, fmt.Errorf("reading the offloads of %s: %w", name, err)
	}
	return on, nil
}

// SetTXChecksum turns FeatureTXChecksum on or off on the named link.
func (h *Handle) SetTXChecksum(name string, on bool) error {
	err := h.withEthtool(func(e *ethtool.Ethtool) error {
		return e.Change(name, map[string]bool{FeatureTXChecksum: on})
	})
	if err != nil {
		return fmt.Errorf("setting %s %v on %s: %w", FeatureTXChecksum, on, name, err)
	}
	return nil
}

// withEthtool runs fn with an ethtool socket of the handle's namespace
// (ethtool's requests go to the devices of the namespace the socket was
// opened in).
func (h *Handle) withEthtool(fn func(*ethtool.Ethtool) error) error {
	e, err := inNS(h, ethtool.NewEthtool, (*ethtool.Ethtool).Close)
	if err != nil {
		return fmt.Errorf("opening an ethtool socket: %w", err)
	}
	defer e.Close()
	return fn(e)
}
