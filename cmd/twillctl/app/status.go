package app

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/twill-net/twill/backend"
	"github.com/twill-net/twill/network"
	"github.com/twill-net/twill/network/netfilter"
	"github.com/twill-net/twill/nl"
	"github.com/twill-net/twill/policy"
	"github.com/twill-net/twill/subnet"
	etcdsm "github.com/twill-net/twill/subnet/etcd"
	"github.com/twill-net/twill/subnet/etcd/etcdflags"
)

type statusOptions struct {
	etcd       etcdflags.Options
	subnetFile string
	stateDir   string
	iface      []string
}

func newStatusCommand(reg *backend.Registry) *cobra.Command {
	var o statusOptions
	cmd := &cobra.Command{
		Use:   "status",
		Short: "Show this node's lease and peers, and how the kernel differs from what twill should have",
		Long: `status runs on a node (or in a lab node: twillctl lab exec node1 -- twillctl status).
It reads subnet.env and the leases in etcd, computes the routes, neighbours and
FDB entries the backend should have programmed, compares them with the kernel
without changing anything, and lists what is missing, extra or wrong. It exits
1 when the kernel has drifted.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return runStatus(cmd.Context(), cmd.OutOrStdout(), reg, o) },
	}
	f := cmd.Flags()
	etcdflags.Add(f, &o.etcd)
	f.StringVar(&o.subnetFile, "subnet-file", "/run/twill/subnet.env", "this node's subnet.env")
	f.StringVar(&o.stateDir, "state-dir", "/var/lib/twill", "twilld's state directory")
	f.StringSliceVar(&o.iface, "iface", nil, "external interface (default: the default route's)")
	cmd.AddCommand(newStatusPolicyCommand())
	return cmd
}

// nodeView is what status reads: this node's lease and peers from etcd,
// and the backend attached to the kernel as twilld would be.
type nodeView struct {
	env     subnet.Env
	cfg     *subnet.Config
	found   bool // the lease is in etcd
	peers   []subnet.Lease
	refused map[string]string
	ext     backend.ExternalInterface
	nw      backend.Attached
	// onFlannel are the peers still on flanneld, on flannel's prefix.
	onFlannel []subnet.Lease
}

func runStatus(ctx context.Context, w io.Writer, reg *backend.Registry, o statusOptions) error {
	ctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	h, err := nl.Open("")
	if err != nil {
		return err
	}
	defer h.Close()
	v, err := readNodeView(ctx, reg, o, h)
	if err != nil {
		return err
	}
	return v.print(ctx, w)
}

func readNodeView(ctx context.Context, reg *backend.Registry, o statusOptions, h *nl.Handle) (*nodeView, error) {
	v := &nodeView{}
	var err error
	if v.env, err = subnet.ReadEnv(o.subnetFile); err != nil {
		return nil, err
	}
	cli, err := o.etcd.Client()
	if err != nil {
		return nil, err
	}
	defer cli.Close()
	if err := etcdsm.Reach(ctx, cli, 5*time.Second); err != nil {
		return nil, err
	}
	m := etcdsm.New(etcdsm.Options{Client: cli, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Prefix: o.etcd.Prefix})
	if v.cfg, err = m.NetworkConfig(ctx); err != nil {
		return nil, err
	}
	snap, err := m.Leases(ctx)
	if err != nil {
		return nil, err
	}
	local := subnet.Lease{Subnet: v.env.Subnet, IPv6Subnet: v.env.IPv6Subnet}
	for _, l := range snap.Leases {
		if l.Subnet == local.Subnet && l.IPv6Subnet == local.IPv6Subnet {
			local, v.found = l, true
		}
	}
	v.peers, v.refused = subnet.Peers(v.cfg, local, snap, nil)
	if strings.TrimSuffix(o.etcd.Prefix, "/") == etcdsm.FlannelPrefix {
		for _, p := range v.peers {
			if p.Attrs.NodeAgent == "" {
				v.onFlannel = append(v.onFlannel, p)
			}
		}
	}
	if v.ext, err = network.ChooseExternal(h, network.IfaceOptions{Ifaces: o.iface, IPv4: v.cfg.EnableIPv4, IPv6: v.cfg.EnableIPv6}); err != nil {
		return nil, err
	}
	be, err := reg.New(v.cfg.BackendType, backend.Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		Netlink: h, ExtIface: v.ext, Config: v.cfg, StateDir: o.stateDir})
	if err != nil {
		return nil, err
	}
	if v.nw, err = be.Attach(ctx, local); err != nil {
		return nil, err
	}
	return v, nil
}

// print writes the lease, the peers not programmed, and the drift; it
// fails when a peer is refused or the kernel drifted.
func (v *nodeView) print(ctx context.Context, w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	leaseState := "held in etcd"
	if !v.found {
		leaseState = "NOT FOUND in etcd"
	}
	fmt.Fprintf(tw, "lease\t%s (%s)\tbackend %s\tpublic IP %s\tMTU %d\n", v.env.Subnet, leaseState, v.cfg.BackendType, v.ext.PublicIP, v.env.MTU)
	if v.nw.Status != nil {
		for _, line := range v.nw.Status.Status(ctx) {
			fmt.Fprintf(tw, "backend\t%s\n", line)
		}
	}
	var d backend.Drift
	if v.nw.Drift != nil {
		var err error
		if d, err = v.nw.Drift.Drift(ctx, v.peers); err != nil {
			return err
		}
	}
	// Leases the daemon refuses (malformed, rogue) and peers the backend
	// refuses (host-gw: not on-link) alike are peers not programmed.
	notProgrammed := make([]string, 0, len(v.refused)+len(d.Refused))
	for k, why := range v.refused {
		notProgrammed = append(notProgrammed, k+": "+why)
	}
	sort.Strings(notProgrammed)
	notProgrammed = append(notProgrammed, d.Refused...)
	fmt.Fprintf(tw, "peers\t%d valid, %d refused\n", len(v.peers)-len(d.Refused), len(notProgrammed))
	for _, r := range notProgrammed {
		fmt.Fprintf(tw, "  refused\t%s\n", r)
	}
	for _, p := range v.onFlannel {
		fmt.Fprintf(tw, "  on flannel\t%s (public IP %s): flanneld's lease, not yet twilld's\n", p, pubIP(p.Attrs))
	}
	for _, sh := range d.Shadowed {
		fmt.Fprintf(tw, "  shadowed\t%s\n", sh)
	}
	switch {
	case v.nw.Drift == nil:
		fmt.Fprintf(tw, "kernel\tthe %s backend cannot report drift\n", v.cfg.BackendType)
	case !d.Clean():
		printDrift(tw, d)
	default:
		fmt.Fprintf(tw, "kernel\tin sync (%d objects checked)\n", d.Objects)
	}
	nfDrift, err := v.printNetfilter(tw)
	if err != nil {
		return err
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if (v.nw.Drift != nil && !d.Clean()) || nfDrift {
		return errDrift
	}
	if len(notProgrammed) > 0 {
		return fmt.Errorf("%d peers are not programmed (refused above)", len(notProgrammed))
	}
	if len(d.Shadowed) > 0 {
		return fmt.Errorf("%d of twill's routes are shadowed by routes it does not own (above)", len(d.Shadowed))
	}
	return nil
}

// printNetfilter compares the masquerade and forward rules of the mode
// twilld uses (subnet.env's TWILL_NETFILTER) with the kernel's, and says
// whether they drifted.
func (v *nodeView) printNetfilter(tw io.Writer) (drifted bool, err error) {
	mode := netfilter.Mode(v.env.Netfilter)
	if mode == "" {
		fmt.Fprintf(tw, "netfilter\tnot checked: subnet.env has no TWILL_NETFILTER (written by an older twilld)\n")
		return false, nil
	}
	o := netfilter.Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), IPMasq: v.env.IPMasq}
	if v.env.Network.IsValid() {
		o.Networks = append(o.Networks, network.NetworkPair{Cluster: v.env.Network, Local: v.env.Subnet})
	}
	if v.env.IPv6Network.IsValid() {
		o.Networks = append(o.Networks, network.NetworkPair{Cluster: v.env.IPv6Network, Local: v.env.IPv6Subnet})
	}
	d, err := netfilter.NewRules(mode, o).Drift()
	if err != nil {
		return false, fmt.Errorf("reading the %s rules: %w", mode, err)
	}
	if d.Clean() {
		fmt.Fprintf(tw, "netfilter\tin sync (%s)\n", mode)
		return false, nil
	}
	fmt.Fprintf(tw, "netfilter\tDRIFT (%s): %d missing, %d extra, %d wrong\n", mode, len(d.Missing), len(d.Extra), len(d.Wrong))
	printLines(tw, d.Missing, d.Extra, d.Wrong)
	return true, nil
}

func printLines(tw io.Writer, missing, extra, wrong []string) {
	for _, s := range missing {
		fmt.Fprintf(tw, "  missing\t%s\n", s)
	}
	for _, s := range extra {
		fmt.Fprintf(tw, "  extra\t%s\n", s)
	}
	for _, s := range wrong {
		fmt.Fprintf(tw, "  wrong\t%s\n", s)
	}
}

func printDrift(tw io.Writer, d backend.Drift) {
	fmt.Fprintf(tw, "kernel\tDRIFT: %d missing, %d extra, %d wrong (of %d objects)\n", len(d.Missing), len(d.Extra), len(d.Wrong), d.Objects)
	printLines(tw, d.Missing, d.Extra, d.Wrong)
}

var errDrift = errors.New("the kernel differs from what twill should have (twilld repairs it within moments if it is running)")

// newStatusPolicyCommand is `twillctl status policy`: what the node's
// policy table isolates, read from the kernel (no datastore needed, so it
// works in Kubernetes mode).
func newStatusPolicyCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "policy",
		Short: "Name, for each pod of this node a NetworkPolicy or ClusterNetworkPolicy selects, the policies that select it",
		Long: `policy runs on a node (in a lab: twillctl lab exec node1 -- twillctl status policy).
It reads twilld's NetworkPolicy table, inet twill-policy, from the kernel and
lists each local pod that a NetworkPolicy or a ClusterNetworkPolicy selects,
with the policies that select it for ingress and for egress. A pod not
listed is allowed everything.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			if err := printPolicy(tw); err != nil {
				return err
			}
			return tw.Flush()
		},
	}
}

// printPolicy names, for each local pod a NetworkPolicy isolates, the
// policies that select it, as the kernel's table inet twill-policy has
// them.
func printPolicy(tw io.Writer) error {
	pods, exists, err := (&policy.Table{}).Isolated()
	if err != nil {
		return fmt.Errorf("reading table inet %s: %w", policy.TableName, err)
	}
	if !exists {
		fmt.Fprintf(tw, "policy	not enforced (no table inet %s: twilld runs without --network-policy)\n", policy.TableName)
		return nil
	}
	fmt.Fprintf(tw, "policy	enforced (table inet %s): %d local pods selected by a policy\n", policy.TableName, len(pods))
	names := make([]string, 0, len(pods))
	for p := range pods {
		names = append(names, p)
	}
	sort.Strings(names)
	dash := func(s []string) string {
		if len(s) == 0 {
			return "-"
		}
		return strings.Join(s, ", ")
	}
	for _, p := range names {
		fmt.Fprintf(tw, "  %s	ingress: %s	egress: %s\n", p, dash(pods[p].Ingress), dash(pods[p].Egress))
	}
	return nil
}
