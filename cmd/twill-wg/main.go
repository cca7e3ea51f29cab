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

// untilSignal runs a command's work, logging to stderr, until SIGTERM or
// SIGINT.
func untilSignal(run func(context.Context, *slog.Logger) error) func(*cobra.Command, []string) error {
	return func(cmd *cobra.Command, _ []string) error {
		ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGTERM, syscall.SIGINT)
		defer stop()
		return run(ctx, slog.New(slog.NewTextHandler(os.Stderr, nil)))
	}
}

// keeperCommand runs devices on twilld's request, in a process of their
// own: the kube-twill-wireguard DaemonSet.
func keeperCommand() *cobra.Command {
	var o userspace.KeeperOptions
	cmd := &cobra.Command{
		Use:   "keeper --socket PATH",
		Short: "Run userspace WireGuard devices on twilld's request, outliving twilld",
		Args:  cobra.NoArgs,
		RunE: untilSignal(func(ctx context.Context, log *slog.Logger) error {
			o.Logger = log
			return userspace.RunKeeper(ctx, o)
		}),
	}
	cmd.Flags().StringVar(&o.Socket, "socket", "/var/lib/twill/twill-wg-keeper.sock", "where to serve device requests (twilld's state directory)")
	return cmd
}

func run() error {
	var o userspace.Options
	cmd := &cobra.Command{
		Use:           "twill-wg --name DEV --socket PATH",
		Short:         "Run a userspace WireGuard device for twilld",
		Args:          cobra.NoArgs,
		SilenceUsage:  true,
		SilenceErrors: true,
		RunE: untilSignal(func(ctx context.Context, log *slog.Logger) error {
			o.Logger = log
			return userspace.Run(ctx, o)
		}),
	}
	cmd.Flags().StringVar(&o.Name, "name", "twill-wg", "the TUN device's name")
	cmd.Flags().StringVar(&o.Socket, "socket", "", "where to serve the userspace API (required to run a device)")
	cmd.Flags().StringVar(&o.PIDFile, "pid-file", "", "where to record this process's PID")
	cmd.Flags().IntVar(&o.MTU, "mtu", 1420, "the device's MTU")
	cmd.AddCommand(keeperCommand())
	return cmd.ExecuteContext(context.Background())
}
