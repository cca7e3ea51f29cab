// Command twill-wg is the userspace WireGuard device twilld's wireguard
// backend starts on kernels without the wireguard module. It outlives
// twilld, so pod traffic keeps flowing while twilld restarts.
package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/twill-net/twill/backend/wireguard/userspace"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "twill-wg:", err)
		os.Exit(1)
	}
}

func run() error {
	var o userspace.Options
	cmd := &cobra.Command{
		Use:           "twill-wg --name DEV --socket PATH",
		Short:         "Run a userspace WireGuard device for twilld",
		Args:          cobra.NoArgs,
		SilenceUsage:  true,
		SilenceErrors: true,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGTERM, syscall.SIGINT)
			defer stop()
			o.Logger = slog.New(slog.NewTextHandler(os.Stderr, nil))
			return userspace.Run(ctx, o)
		},
	}
	cmd.Flags().StringVar(&o.Name, "name", "twill-wg", "the TUN device's name")
	cmd.Flags().StringVar(&o.Socket, "socket", "", "where to serve the userspace API (required)")
	cmd.Flags().StringVar(&o.PIDFile, "pid-file", "", "where to record this process's PID")
	cmd.Flags().IntVar(&o.MTU, "mtu", 1420, "the device's MTU")
	return cmd.ExecuteContext(context.Background())
}
