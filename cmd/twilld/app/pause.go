package app

import "github.com/spf13/cobra"

// newPauseCommand is twilld pause: wait for SIGTERM or SIGINT and exit 0.
// dist/kube-twill-cleanup.yml's pods idle with it once their node is
// clean; twill's image needs no shell or coreutils for it.
func newPauseCommand() *cobra.Command {
	return &cobra.Command{
		Use:    "pause",
		Short:  "Wait for SIGTERM or SIGINT, then exit 0 (the cleanup DaemonSet's idle container)",
		Args:   cobra.NoArgs,
		Hidden: true,
		RunE: func(cmd *cobra.Command, _ []string) error {
			<-cmd.Context().Done() // Main's context ends with either signal
			return nil
		},
	}
}
