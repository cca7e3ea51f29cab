package app

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	clientv3 "go.etcd.io/etcd/client/v3"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/twill-net/twill/subnet"
	etcdsm "github.com/twill-net/twill/subnet/etcd"
	"github.com/twill-net/twill/subnet/etcd/etcdflags"
	kubesm "github.com/twill-net/twill/subnet/kube"
)

func newLeasesCommand() *cobra.Command {
	var (
		o    etcdflags.Options
		kube kubeLeaseOptions
	)
	cmd := &cobra.Command{
		Use:   "leases",
		Short: "List the cluster's subnet leases (etcd, or Kubernetes with --kubeconfig)",
		Example: `  twillctl leases --etcd-endpoints http://10.0.0.1:2379
  twillctl leases --kubeconfig ~/.kube/config     # Node leases, and which twill refuses and why`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if kube.kubeconfig != "" || kube.apiURL != "" {
				return kubeLeases(cmd.Context(), cmd.OutOrStdout(), kube)
			}
			return o.Do(cmd.Context(), func(ctx context.Context, cli *clientv3.Client) error {
				return etcdLeases(ctx, cmd.OutOrStdout(), cli, o.Prefix)
			})
		},
	}
	etcdflags.Add(cmd.PersistentFlags(), &o)
	cmd.AddCommand(&cobra.Command{
		Use:   "delete SUBNET",
		Short: "Delete a node's lease from etcd (a node taken out for good): every node removes its routes to it at once",
		Example: `  twillctl leases delete 10.244.3.0/24 --etcd-endpoints http://10.0.0.1:2379
  twillctl leases delete 10.244.3.0-24     # the key's name works too`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			v4, v6, err := parseSubnetArg(args[0])
			if err != nil {
				return err
			}
			return o.Do(cmd.Context(), func(ctx context.Context, cli *clientv3.Client) error {
				if err := etcdsm.ReleaseLease(ctx, cli, o.Prefix, v4, v6); err != nil {
					return err
				}
				fmt.Fprintln(cmd.OutOrStdout(), "deleted the lease of", subnetsString(v4, v6))
				return nil
			})
		},
	})
	cmd.Flags().StringVar(&kube.kubeconfig, "kubeconfig", "", "list the Node leases of this Kubernetes cluster instead of etcd's")
	cmd.Flags().StringVar(&kube.apiURL, "kube-api-url", "", "apiserver URL (overrides the kubeconfig's server)")
	cmd.Flags().StringVar(&kube.prefix, "kube-annotation-prefix", kubesm.DefaultAnnotationPrefix, "prefix of twill's Node annotations")
	cmd.Flags().StringVar(&kube.netConf, "net-config-path", "", "with --kubeconfig: also refuse subnets outside this net-conf.json's Network, as twilld does")
	return cmd
}

// etcdLeases lists every lease key with what twilld makes of it: a valid
// peer, or refused with the reason every twilld logs.
func etcdLeases(ctx context.Context, w io.Writer, cli *clientv3.Client, keyPrefix string) error {
	m := etcdsm.New(etcdsm.Options{Client: cli, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Prefix: keyPrefix})
	var cfg *subnet.Config
	if c, err := m.NetworkConfig(ctx); err == nil {
		cfg = c
	}
	prefix := m.SubnetsPrefix()
	resp, err := cli.Get(ctx, prefix, clientv3.WithPrefix())
	if err != nil {
		return fmt.Errorf("listing %s: %w", prefix, err)
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SUBNET\tPUBLIC IP\tBACKEND\tEXPIRES\tSTATE")
	ttls := map[int64]int64{}
	for _, kv := range resp.Kvs {
		key := strings.TrimPrefix(string(kv.Key), prefix)
		v4, v6, kerr := subnet.ParseSubnetKey(key)
		attrs, aerr := subnet.ParseLeaseAttrs(kv.Value)
		if kerr != nil || aerr != nil {
			fmt.Fprintf(tw, "%s\t\t\t\tREFUSED: %v\n", key, errors.Join(kerr, aerr))
			continue
		}
		expires := "never (reservation)"
		if kv.Lease != 0 {
			ttl, ok := ttls[kv.Lease]
			if !ok {
				if r, err := cli.TimeToLive(ctx, clientv3.LeaseID(kv.Lease)); err == nil {
					ttl = r.TTL
				}
				ttls[kv.Lease] = ttl
			}
			expires = time.Now().Add(time.Duration(ttl) * time.Second).UTC().Format(time.RFC3339)
		}
		state := "valid"
		l := subnet.Lease{Subnet: v4, IPv6Subnet: v6, Attrs: attrs}
		if attrs.NodeAgent == "" && strings.TrimSuffix(keyPrefix, "/") == etcdsm.FlannelPrefix {
			state = "valid (flannel)"
		}
		switch {
		case cfg == nil:
			state = "? (no net-conf.json in etcd)"
		case subnet.CheckProgrammable(cfg, subnet.Lease{}, l) != nil:
			state = "REFUSED: " + subnet.CheckProgrammable(cfg, subnet.Lease{}, l).Error()
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", subnetsString(v4, v6), pubIP(attrs), attrs.BackendType, expires, state)
	}
	return tw.Flush()
}

type kubeLeaseOptions struct{ kubeconfig, apiURL, prefix, netConf string }

// kubeLeases lists every Node with what twilld makes of it: a peer lease,
// not a peer yet, or refused with the reason every twilld logs.
func kubeLeases(ctx context.Context, w io.Writer, o kubeLeaseOptions) error {
	ann, err := kubesm.NewAnnotations(o.prefix)
	if err != nil {
		return err
	}
	cli, err := kubesm.NewClient(kubesm.ClientOptions{Kubeconfig: o.kubeconfig, APIURL: o.apiURL, UserAgent: "twillctl"})
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	list, err := cli.ListNodes(ctx, metav1.ListOptions{})
	if err != nil {
		return fmt.Errorf("listing Nodes: %w", err)
	}
	nodes := make([]*corev1.Node, len(list.Items))
	for i := range list.Items {
		nodes[i] = &list.Items[i]
	}
	var cfg *subnet.Config
	if o.netConf != "" {
		data, err := os.ReadFile(o.netConf)
		if err != nil {
			return fmt.Errorf("--net-config-path: %w", err)
		}
		if cfg, err = subnet.ParseConfig(data); err != nil {
			return fmt.Errorf("%s: %w", o.netConf, err)
		}
	}
	refused := map[string]string{}
	for _, r := range ann.Snapshot(nodes, "").Refused {
		refused[strings.TrimPrefix(r.Key, "node/")] = r.Err.Error()
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NODE\tSUBNET\tPUBLIC IP\tBACKEND\tSTATE")
	for _, n := range nodes {
		l, peer, _ := ann.NodeLease(n)
		v4, v6, _ := kubesm.PodCIDRs(n)
		if peer && cfg != nil && refused[n.Name] == "" {
			c := *cfg // in Kubernetes the podCIDR's length is the node's own
			c.SubnetLen, c.IPv6SubnetLen = l.Subnet.Bits(), l.IPv6Subnet.Bits()
			if err := subnet.CheckPeer(&c, subnet.Lease{}, l); err != nil {
				refused[n.Name] = err.Error()
			}
		}
		state := "peer"
		if ann.OnFlannel(n) {
			state = "peer (flannel)"
		}
		switch {
		case refused[n.Name] != "":
			state = "REFUSED: " + refused[n.Name]
		case !peer && !v4.IsValid() && !v6.IsValid():
			state = "not a peer yet: no podCIDR"
		case !peer:
			state = "not a peer yet: no twill annotations"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", n.Name, subnetsString(v4, v6), pubIP(l.Attrs), l.Attrs.BackendType, state)
	}
	return tw.Flush()
}

// parseSubnetArg reads a lease named as a CIDR ("10.244.3.0/24", or a
// dual-stack pair joined by a comma) or as its key ("10.244.3.0-24").
func parseSubnetArg(arg string) (v4, v6 netip.Prefix, err error) {
	if strings.Contains(arg, "/") {
		arg = strings.ReplaceAll(strings.ReplaceAll(arg, "/", "-"), ",", "&")
	}
	v4, v6, err = subnet.ParseSubnetKey(arg)
	if err != nil {
		return v4, v6, fmt.Errorf("SUBNET %q: want a CIDR such as 10.244.3.0/24, or a lease key such as 10.244.3.0-24", arg)
	}
	return v4, v6, nil
}

func subnetsString(v4, v6 netip.Prefix) string {
	var s []string
	for _, p := range []netip.Prefix{v4, v6} {
		if p.IsValid() {
			s = append(s, p.String())
		}
	}
	if len(s) == 0 {
		return "-"
	}
	return strings.Join(s, ",")
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
