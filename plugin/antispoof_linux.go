package plugin

import (
	"fmt"
	"strings"

	"github.com/twill-net/twill/nl"
	"github.com/twill-net/twill/nl/nft"
	"github.com/twill-net/twill/plugin/antispoof"
)

// addAntiSpoof puts the pod's veth under the source address check (see
// package antispoof) before the pod runs, and pushes its removal. The
// node's other pods' veths (twill's, found by their alias) go in with it:
// pods wired before the check existed, or whose element went, are under
// it from the node's next ADD on.
func addAntiSpoof(host *nl.Handle, w Wiring, undo *undoStack) error {
	links := []string{w.HostVeth}
	all, err := host.Links()
	if err != nil {
		return fmt.Errorf("twill: %w", err)
	}
	for _, l := range all {
		if strings.HasPrefix(l.Alias, nl.PodLinkAliasPrefix) && l.Name != w.HostVeth {
			links = append(links, l.Name)
		}
	}
	if err := antispoof.Add(nft.Conn{}, links...); err != nil {
		return fmt.Errorf("twill: %w", err)
	}
	undo.push(func() { _ = antispoof.Remove(nft.Conn{}, w.HostVeth) })
	return nil
}

// delAntiSpoof takes the attachment's veth out of the check.
func delAntiSpoof(hostVeth string) error {
	if err := antispoof.Remove(nft.Conn{}, hostVeth); err != nil {
		return fmt.Errorf("twill: %w", err)
	}
	return nil
}

// checkAntiSpoof verifies the pod's veth is under the check.
func checkAntiSpoof(w Wiring) error {
	if err := antispoof.Check(nft.Conn{}, w.HostVeth); err != nil {
		return fmt.Errorf("twill: CHECK: %w", err)
	}
	return nil
}

// pruneAntiSpoof takes out of the check the veths that are gone, of this
// network or any other.
func pruneAntiSpoof(host *nl.Handle) error {
	var errs []error
	_, err := antispoof.Prune(nft.Conn{}, func(link string) bool {
		exists, err := host.LinkExists(link)
		if err != nil {
			errs = append(errs, err)
			return false
		}
		return !exists
	})
	if err != nil {
		return fmt.Errorf("twill: %w", err)
	}
	if len(errs) > 0 {
		return fmt.Errorf("twill: collecting the anti-spoofing check's links: %w", errs[0])
	}
	return nil
}
