// Package cleanup is twilld cleanup: it removes what twill programmed on a
// node, found by twill's identities (package owned), without the
// configuration or the datastore.
package cleanup

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/twill-net/twill/internal/runlock"
	"github.com/twill-net/twill/network/netfilter"
	"github.com/twill-net/twill/nl"
	"github.com/twill-net/twill/policy"
	"github.com/twill-net/twill/subnet"
)

// Options say what twilld cleanup removes besides the kernel state.
type Options struct {
	SubnetFile string
	// StateDir's files twill wrote (the vxlan VTEP MAC) are removed.
	StateDir string
	// ReleaseLease, when set, gives the node's lease (read from subnet.env)
	// back, so that the other nodes stop routing to it now rather than
	// when the lease expires.
	ReleaseLease func(env subnet.Env) error
	// RemoveFiles are removed too (the CNI conflist and plugin binary, on
	// a node twill leaves); one already gone is no error.
	RemoveFiles []string
	// HandOverToFlannel leaves the data plane to the flanneld that starts
	// next (a node rolled back to flannel): twill's routes stay, which
	// flanneld keeps or replaces as its own, and twill's VXLAN device is
	// made again under flanneld's name with all that went through it
	// (handOverVXLAN), so that the node's pods are not cut off until
	// flanneld has started.
	HandOverToFlannel bool
	// Wait bounds the wait for a twilld of this node (the one whose
	// subnet.env is SubnetFile) to stop: a twilld still running would put
	// back what cleanup removes. Zero does not wait.
	Wait time.Duration
}

// Node removes everything twill programmed in the handle's namespace:
// routes with twill's protocol in any table, twill's policy rules (and the
// route the eni backend took out of main), twill's devices, its iptables
// chains and nftables table, subnet.env, and the state files. It finds them by the identities
// in package owned, so it needs neither the configuration nor etcd (unless
// asked to release the lease). It leaves IP forwarding on: other software
// on the node (kube-proxy, a container engine) may rely on it, and twill
// cannot know whether it was on before.
func Node(log *slog.Logger, h *nl.Handle, o Options) error {
	subnetFile := o.SubnetFile
	lock := runlock.Path(subnetFile)
	release, err := runlock.WaitFree(context.Background(), lock, o.Wait)
	if err != nil {
		return err
	}
	defer func() {
		_ = os.Remove(lock) // twill's last file on the node; a twilld starting makes it again
		release()
	}()
	var errs []error
	released := ""
	if o.ReleaseLease != nil {
		env, err := subnet.ReadEnv(subnetFile)
		switch {
		case err != nil:
			errs = append(errs, fmt.Errorf("releasing the lease: %w", err))
		default:
			if err := o.ReleaseLease(env); err != nil {
				errs = append(errs, fmt.Errorf("releasing the lease: %w", err))
			} else {
				released = subnet.SubnetKey(env.Subnet, env.IPv6Subnet)
			}
		}
	}
	var routes []nl.Route
	if !o.HandOverToFlannel {
		routes, err = h.Routes(nl.FamilyAll, nl.RouteFilter{AllTables: true, Protocol: nl.RouteProtocol})
		if err != nil {
			errs = append(errs, err)
		}
	}
	for _, r := range routes {
		if err := h.RouteDel(r); err != nil {
			errs = append(errs, err)
		}
	}
	rules, restored, err := cleanupRules(h)
	if err != nil {
		errs = append(errs, err)
	}
	removed, err := removeDevices(h, o.HandOverToFlannel)
	if err != nil {
		errs = append(errs, err)
	}
	if err := netfilter.Cleanup(); err != nil {
		errs = append(errs, err)
	}
	// Policy enforcement outlives twilld (fail closed) until cleanup.
	if _, err := (&policy.Table{}).Delete(); err != nil {
		errs = append(errs, err)
	}
	if err := os.Remove(subnetFile); err != nil && !errors.Is(err, os.ErrNotExist) {
		errs = append(errs, fmt.Errorf("removing %s: %w", subnetFile, err))
	}
	state, err := removeFiles(o)
	if err != nil {
		errs = append(errs, err)
	}
	log.Info("cleaned up", "routes", len(routes), "rules", rules, "restored", restored, "devices", removed, "subnet_file", subnetFile,
		"files", state, "released_lease", released)
	return errors.Join(errs...)
}

// removeDevices deletes twill's devices (a userspace WireGuard device's
// TUN link too, which stops its twill-wg), or, handing over to flannel,
// makes its VXLAN devices flanneld's; it returns what it did, by device.
func removeDevices(h *nl.Handle, handOver bool) ([]string, error) {
	links, err := h.Links()
	if err != nil {
		return nil, err
	}
	var (
		removed []string
		errs    []error
	)
	for _, l := range links {
		vxlan := strings.HasPrefix(l.Name, nl.VXLANDevicePrefix)
		switch {
		case handOver && vxlan:
			name, err := handOverVXLAN(h, l)
			errs = append(errs, err)
			if name != "" {
				removed = append(removed, l.Name+" (handed over to flannel as "+name+")")
			}
		case vxlan || strings.HasPrefix(l.Name, nl.WireGuardDevicePrefix):
			if err := h.LinkDel(l.Index); err != nil {
				errs = append(errs, err)
				continue
			}
			removed = append(removed, l.Name)
		}
	}
	return removed, errors.Join(errs...)
}

// removeFiles removes twill's files in o.StateDir (the vxlan VTEP MACs,
// the WireGuard key) and o.RemoveFiles, and returns those it removed.
func removeFiles(o Options) ([]string, error) {
	var files []string
	if o.StateDir != "" {
		macs, _ := filepath.Glob(filepath.Join(o.StateDir, "vxlan-*.mac"))
		keys, _ := filepath.Glob(filepath.Join(o.StateDir, "wireguard.key"))
		files = append(macs, keys...)
	}
	var (
		removed []string
		errs    []error
	)
	for _, f := range append(files, o.RemoveFiles...) {
		switch err := os.Remove(f); {
		case err == nil:
			removed = append(removed, f)
		case !errors.Is(err, os.ErrNotExist):
			errs = append(errs, err)
		}
	}
	return removed, errors.Join(errs...)
}

// cleanupRules deletes the policy rules twilld made (protocol 167). A rule
// from an address of this node is the eni backend's rule for its ENI; the
// backend also took that address's subnet route out of main, so it is put
// back, as the kernel had it.
func cleanupRules(h *nl.Handle) (deleted int, restored []string, err error) {
	rules, err := h.Rules(nl.FamilyAll)
	if err != nil {
		return 0, nil, err
	}
	var errs []error
	for _, r := range rules {
		if r.Protocol != nl.RouteProtocol {
			continue
		}
		if err := h.RuleDel(r); err != nil {
			errs = append(errs, err)
			continue
		}
		deleted++
		if !r.Src.IsValid() || !r.Src.IsSingleIP() {
			continue
		}
		links, err := h.Links()
		if err != nil {
			errs = append(errs, err)
			continue
		}
		for _, l := range links {
			addrs, err := h.Addrs(l.Index, nl.FamilyAll)
			if err != nil {
				continue
			}
			for _, a := range addrs {
				if a.Prefix.Addr() != r.Src.Addr() || a.Prefix.IsSingleIP() {
					continue
				}
				rt := nl.Route{Dst: a.Prefix.Masked(), LinkIndex: l.Index, Scope: nl.ScopeLink, Src: a.Prefix.Addr(), Protocol: kernelProtocol}
				if err := h.RouteAdd(rt); err == nil {
					restored = append(restored, rt.Dst.String()+" dev "+l.Name)
				}
			}
		}
	}
	return deleted, restored, errors.Join(errs...)
}

// kernelProtocol is RTPROT_KERNEL: routes the kernel adds for an address.
const kernelProtocol = 2
