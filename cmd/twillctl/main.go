// Command twillctl is twill's operator and lab tool.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/twill-net/twill/internal/etcdserver"
	"github.com/twill-net/twill/internal/version"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	err := newRootCommand().ExecuteContext(ctx)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "twillctl:", err)
		os.Exit(1)
	}
}

func newRootCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:           "twillctl",
		Short:         "Operate and try out twill",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	cmd.AddCommand(newEtcdCommand(), &cobra.Command{
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
	_ = cmd.MarkFlagRequired("data-dir")
	return cmd
}

func runEtcd(ctx context.Context, o etcdOptions) error {
	srv, err := etcdserver.Start(ctx, etcdserver.Config{Dir: o.dataDir, ClientURLs: o.clientURLs, PeerURL: o.peerURL})
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
