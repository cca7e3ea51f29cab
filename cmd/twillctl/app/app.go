// Package app is twillctl's command line. cmd/twillctl's main calls Main
// with the default backend registry; a custom twillctl that knows extra
// backends (so that status checks their kernel state, and config put
// validates their configuration) does the same after blank-importing them,
// as a custom twilld does (see Documentation/writing-a-backend.md).
package app

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/spf13/cobra"

	"github.com/twill-net/twill/backend"
	"github.com/twill-net/twill/internal/cnidriver"
	"github.com/twill-net/twill/internal/etcdflags"
	"github.com/twill-net/twill/internal/etcdserver"
	"github.com/twill-net/twill/internal/version"
	"github.com/twill-net/twill/subnet"
)

// Main runs twillctl with the backends in reg and returns the process exit
// code.
func Main(reg *backend.Registry) int {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if err := newRootCommand(reg).ExecuteContext(ctx); err != nil {
		var code exitCode
		if errors.As(err, &code) {
			return int(code) // the command run (lab exec) said why itself
		}
		fmt.Fprintln(os.Stderr, "twillctl:", err)
		return 1
	}
	return 0
}

// exitCode is the exit status of a command twillctl ran for the user; it
// becomes twillctl's own, with nothing added.
type exitCode int

func (c exitCode) Error() string { return fmt.Sprintf("exit status %d", int(c)) }

func newRootCommand(reg *backend.Registry) *cobra.Command {
	cmd := &cobra.Command{
		Use:           "twillctl",
		Short:         "Operate and try out twill",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	cmd.AddCommand(newLabCommand(), newStatusCommand(reg), newLeasesCommand(), newEtcdCommand(), newConfigCommand(reg), newCNICommand(), &cobra.Command{
		Use:   "version",
		Short: "Print the version",
		Args:  cobra.NoArgs,
		Run:   func(cmd *cobra.Command, _ []string) { fmt.Fprintln(cmd.OutOrStdout(), "twillctl", version.Version) },
	})
	return cmd
}

type etcdOptions struct {
	dataDir    string
	clientURLs []string
	peerURL    string
	tls        etcdserver.Config // its TLS fields
}

func newEtcdCommand() *cobra.Command {
	var o etcdOptions
	cmd := &cobra.Command{
		Use:   "etcd",
		Short: "Run a single-member embedded etcd (for labs and tests, not production)",
		Example: `  # inside a lab namespace, reachable from the node namespaces
  ip netns exec lab-underlay twillctl etcd --data-dir /tmp/lab/etcd --listen-client-urls http://10.99.0.254:2379,unix:///tmp/lab/etcd.sock`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return runEtcd(cmd.Context(), o) },
	}
	cmd.Flags().StringVar(&o.dataDir, "data-dir", "", "data directory (required)")
	cmd.Flags().StringSliceVar(&o.clientURLs, "listen-client-urls", []string{"http://127.0.0.1:2379"}, "client URLs to listen on and advertise (http://IP:PORT or unix:///path)")
	cmd.Flags().StringVar(&o.peerURL, "listen-peer-url", "", "peer URL (default: a free loopback port)")
	cmd.Flags().StringVar(&o.tls.CertFile, "cert-file", "", "serving certificate for https client URLs")
	cmd.Flags().StringVar(&o.tls.KeyFile, "key-file", "", "key of --cert-file")
	cmd.Flags().StringVar(&o.tls.TrustedCAFile, "trusted-ca-file", "", "CA that signs client certificates")
	cmd.Flags().BoolVar(&o.tls.ClientCertAuth, "client-cert-auth", false, "require a client certificate signed by --trusted-ca-file (its common name is the etcd user once auth is enabled)")
	_ = cmd.MarkFlagRequired("data-dir")
	return cmd
}

func runEtcd(ctx context.Context, o etcdOptions) error {
	c := o.tls
	c.Dir, c.ClientURLs, c.PeerURL = o.dataDir, o.clientURLs, o.peerURL
	srv, err := etcdserver.Start(ctx, c)
	if err != nil {
		return err
	}
	defer srv.Close()
	fmt.Fprintln(os.Stderr, "etcd ready on", strings.Join(o.clientURLs, ", "))
	select {
	case <-ctx.Done():
		return nil
	case err := <-srv.Err():
		return fmt.Errorf("etcd stopped: %w", err)
	}
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

func newCNICommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "cni",
		Short: "Drive CNI plugins through libcni, as a container runtime does",
	}
	cmd.AddCommand(&cobra.Command{
		Use:   "run",
		Short: "Run the CNI operations described by a JSON request on standard input",
		Long: `run reads a request (op add|check|del|gc|status, confList, binDirs, cacheDir,
attachments [{containerID, ifName, netns}], parallel, valid) on standard input,
carries it out with libcni in the current network namespace, and prints one
outcome per attachment as JSON. It exits 2 when an outcome is an error, 1
when the request itself is wrong. Run it inside a node's namespace:
ip netns exec NODE twillctl cni run < request.json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var req cnidriver.Request
			if err := json.NewDecoder(cmd.InOrStdin()).Decode(&req); err != nil {
				return fmt.Errorf("decoding request: %w", err)
			}
			resp, err := cnidriver.Run(cmd.Context(), req)
			if err != nil {
				return err
			}
			if err := json.NewEncoder(cmd.OutOrStdout()).Encode(resp); err != nil {
				return err
			}
			if n := resp.Failed(); n > 0 {
				fmt.Fprintf(cmd.ErrOrStderr(), "twillctl: %d of %d CNI operations failed (their errors are in the output)\n", n, len(resp.Outcomes))
				return exitCode(2)
			}
			return nil
		},
	})
	return cmd
}
