// Package app is twillctl's command line. cmd/twillctl's main calls Main
// with the default backend registry; a custom twillctl that knows extra
// backends (so that status checks their kernel state, and config put
// validates their configuration) does the same after blank-importing them,
// as a custom twilld does (see Documentation/writing-a-backend.md).
package app

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/spf13/cobra"

	"github.com/twill-net/twill/backend"
	"github.com/twill-net/twill/internal/version"
	"github.com/twill-net/twill/subnet"
	"github.com/twill-net/twill/subnet/etcd/etcdflags"
)

// Main runs twillctl with the backends in reg and returns the process exit
// code.
func Main(reg *backend.Registry) int {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if err := newRootCommand(reg).ExecuteContext(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "twillctl:", err)
		return 1
	}
	return 0
}

func newRootCommand(reg *backend.Registry) *cobra.Command {
	cmd := &cobra.Command{
		Use:           "twillctl",
		Short:         "Operate and try out twill",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	cmd.AddCommand(newStatusCommand(reg), newLeasesCommand(), newConfigCommand(reg), newPolicyCommand(), &cobra.Command{
		Use:   "version",
		Short: "Print the version",
		Args:  cobra.NoArgs,
		Run:   func(cmd *cobra.Command, _ []string) { fmt.Fprintln(cmd.OutOrStdout(), "twillctl", version.Version) },
	})
	cmd.AddCommand(labCommands()...)
	return cmd
}

func newConfigCommand(reg *backend.Registry) *cobra.Command {
	var o etcdflags.Options
	cmd := &cobra.Command{
		Use:   "config",
		Short: "Read or write the cluster's net-conf.json in etcd",
	}
	etcdflags.Add(cmd.PersistentFlags(), &o)
	cmd.AddCommand(&cobra.Command{
		Use:   "put FILE",
		Short: "Validate net-conf.json and store it at <prefix>/config (- reads standard input)",
		Example: `  twillctl config put --etcd-endpoints http://10.0.0.1:2379 net-conf.json
  echo '{"Network":"10.244.0.0/16","Backend":{"Type":"host-gw"}}' | twillctl config put -`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			var data []byte
			var err error
			if args[0] == "-" {
				data, err = io.ReadAll(cmd.InOrStdin())
			} else {
				data, err = os.ReadFile(args[0])
			}
			if err != nil {
				return fmt.Errorf("reading net-conf.json: %w", err)
			}
			// The same checks twilld makes, the backend's strict
			// decoding included: nothing is written unless every node
			// would accept it.
			cfg, err := subnet.ParseConfig(data)
			if err != nil {
				return err
			}
			if err := reg.Check(cfg); err != nil {
				return err
			}
			return o.Do(cmd.Context(), func(ctx context.Context, cli *clientv3.Client) error {
				key := strings.TrimRight(o.Prefix, "/") + "/config"
				if _, err := cli.Put(ctx, key, string(data)); err != nil {
					return fmt.Errorf("writing %s: %w", key, err)
				}
				fmt.Fprintln(cmd.OutOrStdout(), "stored", key)
				return nil
			})
		},
	}, &cobra.Command{
		Use:   "get",
		Short: "Print the net-conf.json stored in etcd",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return o.Do(cmd.Context(), func(ctx context.Context, cli *clientv3.Client) error {
				key := strings.TrimRight(o.Prefix, "/") + "/config"
				resp, err := cli.Get(ctx, key)
				if err != nil {
					return fmt.Errorf("reading %s: %w", key, err)
				}
				if len(resp.Kvs) == 0 {
					return fmt.Errorf("%s: no configuration stored", key)
				}
				fmt.Fprintln(cmd.OutOrStdout(), string(resp.Kvs[0].Value))
				return nil
			})
		},
	})
	return cmd
}
