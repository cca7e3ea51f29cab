// Package app is the lab's command line: twillctl's lab, etcd and cni
// commands, built as their own binary, twill-lab, so that the operator's
// twillctl (the one the image ships) links none of the lab, its embedded
// etcd or its CNI driver. twillctl runs twill-lab in its own place for
// these commands (cmd/twillctl/app/lab.go), so `twillctl lab up` works
// wherever twill-lab sits next to twillctl, as make build puts it.
package app

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/twill-net/twill/internal/version"
	"github.com/twill-net/twill/lab/cnidriver"
	"github.com/twill-net/twill/lab/etcdserver"
)

// Main runs the lab's commands and returns the process exit code.
func Main() int {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if err := newRootCommand().ExecuteContext(ctx); err != nil {
		var code exitCode
		if errors.As(err, &code) {
			return int(code) // the command run (lab exec) said why itself
		}
		fmt.Fprintln(os.Stderr, "twillctl:", err)
		return 1
	}
	return 0
}

// exitCode is the exit status of a command run for the user; it becomes
// the process's own, with nothing added.
type exitCode int

func (c exitCode) Error() string { return fmt.Sprintf("exit status %d", int(c)) }

func newRootCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:           "twillctl",
		Short:         "twillctl's lab commands (the twill-lab binary): a cluster on this machine, its etcd, a CNI driver",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	cmd.AddCommand(newLabCommand(), newEtcdCommand(), newCNICommand(), &cobra.Command{
		Use:   "version",
		Short: "Print the version",
		Args:  cobra.NoArgs,
		Run:   func(cmd *cobra.Command, _ []string) { fmt.Fprintln(cmd.OutOrStdout(), "twill-lab", version.Version) },
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
