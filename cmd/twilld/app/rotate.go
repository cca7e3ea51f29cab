package app

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"syscall"

	"github.com/spf13/cobra"
)

// newRotateKeyCommand asks a running twilld to replace its backend's key
// pair (the wireguard backend's): SIGUSR1, which images without a shell
// or kill(1) cannot send otherwise (kubectl exec ... -- twilld rotate-key).
func newRotateKeyCommand() *cobra.Command {
	var pid int
	cmd := &cobra.Command{
		Use:   "rotate-key",
		Short: "Ask the running twilld to replace its WireGuard key pair now (SIGUSR1)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := signalTwilld(pid); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "asked twilld (PID %d) to rotate its key pair; its log says when it has\n", pid)
			return nil
		},
	}
	cmd.Flags().IntVar(&pid, "pid", 1, "twilld's PID (1 in its container)")
	return cmd
}

// signalTwilld sends SIGUSR1 to pid once its command line shows twilld.
func signalTwilld(pid int) error {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil {
		return fmt.Errorf("--pid %d: %w", pid, err)
	}
	argv0, _, _ := bytes.Cut(raw, []byte{0})
	if filepath.Base(string(argv0)) != "twilld" {
		return fmt.Errorf("--pid %d: not twilld but %q; pass twilld's PID", pid, argv0)
	}
	if err := syscall.Kill(pid, syscall.SIGUSR1); err != nil {
		return fmt.Errorf("signalling twilld (PID %d): %w", pid, err)
	}
	return nil
}
