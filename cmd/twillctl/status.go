package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/twill-net/twill/backend"
	_ "github.com/twill-net/twill/backend/hostgw" // the built-in backends, to compute their desired state
	"github.com/twill-net/twill/backend/nl"
	_ "github.com/twill-net/twill/backend/vxlan"
	"github.com/twill-net/twill/network"
	"github.com/twill-net/twill/subnet"
	etcdsm "github.com/twill-net/twill/subnet/etcd"
)

type statusOptions struct {
	etcd       configOptions
	subnetFile string
	stateDir   string
	iface      []string
}

func newStatusCommand() *cobra.Command {
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
		RunE: func(cmd *cobra.Command, _ []string) error { return runStatus(cmd.Context(), cmd.OutOrStdout(), o) },
	}
	f := cmd.Flags()
	addEtcdFlags(f, &o.etcd)
	f.StringVar(&o.subnetFile, "subnet-file", "/run/twill/subnet.env", "this node's subnet.env")
	f.StringVar(&o.stateDir, "state-dir", "/var/lib/twill", "twilld's state directory")
	f.StringSliceVar(&o.iface, "iface", nil, "external interface (default: the default route's)")
	return cmd
}

func runStatus(ctx context.Context, w io.Writer, o statusOptions) error {
	env, err := subnet.ReadEnv(o.subnetFile)
	if err != nil {
		return err
	}
	cli, err := o.etcd.client()
	if err != nil {
		return err
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	m := etcdsm.New(etcdsm.Options{Client: cli, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Prefix: o.etcd.prefix})
	cfg, err := m.NetworkConfig(ctx)
	if err != nil {
		return err
	}
	snap, err := m.Leases(ctx)
	if err != nil {
		return err
	}
	local := subnet.Lease{Subnet: env.Subnet, IPv6Subnet: env.IPv6Subnet}
	found := false
	for _, l := range snap.Leases {
		if l.Subnet == local.Subnet && l.IPv6Subnet == local.IPv6Subnet {
			local, found = l, true
		}
	}
	peers, refused := subnet.Peers(cfg, local, snap, nil)

	h, err := nl.Open("")
	if err != nil {
		return err
	}
	defer h.Close()
	ext, err := network.ChooseExternal(h, network.IfaceOptions{Ifaces: o.iface, IPv4: cfg.EnableIPv4, IPv6: cfg.EnableIPv6})
	if err != nil {
		return err
	}
	if cfg.BackendType == "eni" {
		// Attaching eni would call its cloud provider; status stays read-only.
		fmt.Fprintf(w, "lease\t%s\tbackend eni\tMTU %d\npeers\t%d valid, %d refused\nkernel\tdrift is not checked for eni; see `ip rule` and `ip route show table %s`\n",
			env.Subnet, env.MTU, len(peers), len(refused), env.Extra["ENI_TABLE"])
		return nil
	}
	be, err := backend.Default.New(cfg.BackendType, backend.Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		Netlink: h, ExtIface: ext, Config: cfg, StateDir: o.stateDir})
	if err != nil {
		return err
	}
	nw, err := be.Attach(ctx, local)
	if err != nil {
		return err
	}

	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	leaseState := "held in etcd"
	if !found {
		leaseState = "NOT FOUND in etcd"
	}
	fmt.Fprintf(tw, "lease\t%s (%s)\tbackend %s\tpublic IP %s\tMTU %d\n", env.Subnet, leaseState, cfg.BackendType, ext.PublicIP, env.MTU)
	fmt.Fprintf(tw, "peers\t%d valid, %d refused\n", len(peers), len(refused))
	keys := make([]string, 0, len(refused))
	for k := range refused {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		fmt.Fprintf(tw, "  refused\t%s: %s\n", k, refused[k])
	}
	dr, ok := nw.(backend.DriftReporter)
	if !ok {
		fmt.Fprintf(tw, "kernel\tthe %s backend cannot report drift\n", cfg.BackendType)
		return tw.Flush()
	}
	d, err := dr.Drift(ctx, peers)
	if err != nil {
		return err
	}
	if d.Clean() {
		fmt.Fprintf(tw, "kernel\tin sync (%d objects checked)\n", d.Objects)
		return tw.Flush()
	}
	fmt.Fprintf(tw, "kernel\tDRIFT: %d missing, %d extra, %d wrong (of %d objects)\n", len(d.Missing), len(d.Extra), len(d.Wrong), d.Objects)
	for _, s := range d.Missing {
		fmt.Fprintf(tw, "  missing\t%s\n", s)
	}
	for _, s := range d.Extra {
		fmt.Fprintf(tw, "  extra\t%s\n", s)
	}
	for _, s := range d.Wrong {
		fmt.Fprintf(tw, "  wrong\t%s\n", s)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	return errDrift
}

var errDrift = errors.New("the kernel differs from what twill should have (twilld repairs it within moments if it is running)")

func newLeasesCommand() *cobra.Command {
	var o configOptions
	cmd := &cobra.Command{
		Use:   "leases",
		Short: "List the cluster's subnet leases (etcd mode)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cli, err := o.client()
			if err != nil {
				return err
			}
			defer cli.Close()
			ctx, cancel := context.WithTimeout(cmd.Context(), 30*time.Second)
			defer cancel()
			prefix := strings.TrimRight(o.prefix, "/") + "/subnets/"
			resp, err := cli.Get(ctx, prefix, clientv3.WithPrefix())
			if err != nil {
				return fmt.Errorf("listing %s: %w", prefix, err)
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "SUBNET\tPUBLIC IP\tBACKEND\tEXPIRES")
			ttls := map[int64]int64{}
			for _, kv := range resp.Kvs {
				key := strings.TrimPrefix(string(kv.Key), prefix)
				v4, v6, kerr := subnet.ParseSubnetKey(key)
				attrs, aerr := subnet.ParseLeaseAttrs(kv.Value)
				if kerr != nil || aerr != nil {
					fmt.Fprintf(tw, "%s\t(unreadable: %v)\t\t\n", key, errors.Join(kerr, aerr))
					continue
				}
				name := v4.String()
				if !v4.IsValid() {
					name = v6.String()
				} else if v6.IsValid() {
					name += "," + v6.String()
				}
				expires := "never (reservation)"
				if kv.Lease != 0 {
					ttl, ok := ttls[kv.Lease]
					if !ok {
						r, err := cli.TimeToLive(ctx, clientv3.LeaseID(kv.Lease))
						if err == nil {
							ttl = r.TTL
						}
						ttls[kv.Lease] = ttl
					}
					expires = time.Now().Add(time.Duration(ttl) * time.Second).UTC().Format(time.RFC3339)
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", name, pubIP(attrs), attrs.BackendType, expires)
			}
			return tw.Flush()
		},
	}
	addEtcdFlags(cmd.Flags(), &o)
	return cmd
}

func pubIP(a subnet.LeaseAttrs) string {
	var s []string
	for _, ip := range []netip.Addr{a.PublicIP, a.PublicIPv6} {
		if ip.IsValid() {
			s = append(s, ip.String())
		}
	}
	return strings.Join(s, ",")
}
