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
	err := command().ExecuteContext(context.Background())
	if err != nil {
		fmt.Fprintln(os.Stderr, "twill-wg:", err)
		os.Exit(1)
	}
}

// untilSignal is a command (no positional arguments) whose work runs,
// logging to stderr, until SIGTERM or SIGINT.
func untilSignal(use, short string, run func(context.Context, *slog.Logger) error) *cobra.Command {
	return &cobra.Command{Use: use, Short: short, Args: cobra.NoArgs, RunE: func(cmd *cobra.Command, _ []string) error {
		ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGTERM, syscall.SIGINT)
		defer stop()
		return run(ctx, slog.New(slog.NewTextHandler(os.Stderr, nil)))
	}}
}

// keeperCommand runs devices on twilld's request, in a process of their
// own: the kube-twill-wireguard DaemonSet.
func keeperCommand() *cobra.Command {
	var socket string
	cmd := untilSignal("keeper --socket PATH", "Run userspace WireGuard devices on twilld's request, outliving twilld",
		func(ctx context.Context, log *slog.Logger) error {
			return userspace.RunKeeper(ctx, userspace.KeeperOptions{Socket: socket, Logger: log})
		})
	cmd.Flags().StringVar(&socket, "socket", "/var/lib/twill/twill-wg-keeper.sock", "where to serve device requests (twilld's state directory)")
	return cmd
}

// command is twill-wg: one device, or (keeper) the devices twilld asks for.
func command() *cobra.Command {
	var o userspace.Options
	cmd := untilSignal("twill-wg --name DEV --socket PATH", "Run a userspace WireGuard device for twilld",
		func(ctx context.Context, log *slog.Logger) error {
			o.Logger = log
			return userspace.Run(ctx, o)
		})
	cmd.SilenceUsage, cmd.SilenceErrors = true, true
	cmd.Flags().StringVar(&o.Name, "name", "twill-wg", "the TUN device's name")
	cmd.Flags().StringVar(&o.Socket, "socket", "", "where to serve the userspace API (required to run a device)")
	cmd.Flags().StringVar(&o.PIDFile, "pid-file", "", "where to record this process's PID")
	cmd.Flags().IntVar(&o.MTU, "mtu", 1420, "the device's MTU")
	cmd.AddCommand(keeperCommand())
	return cmd
}
