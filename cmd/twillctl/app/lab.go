package app

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"

	"github.com/spf13/cobra"
)

// labBinary holds twillctl's lab commands (cmd/twill-lab): the lab, the
// embedded etcd it runs, and the CNI driver. The operator's twillctl links
// none of them; it runs labBinary in its own place instead.
const labBinary = "twill-lab"

// labCommands stand for the commands of labBinary.
func labCommands() []*cobra.Command {
	var cmds []*cobra.Command
	for _, c := range []struct{ use, short string }{
		{"lab", "A twill cluster on this machine, made of network namespaces"},
		{"etcd", "Run a single-member embedded etcd (for labs and tests, not production)"},
		{"cni", "Drive CNI plugins through libcni, as a container runtime does"},
	} {
		cmds = append(cmds, &cobra.Command{
			Use:                c.use,
			Short:              c.short + " (" + labBinary + ")",
			DisableFlagParsing: true,
			RunE: func(cmd *cobra.Command, args []string) error {
				return execLab(c.use, args)
			},
		})
	}
	return cmds
}

// execLab replaces this process with labBinary running the command, so
// that its output, exit status and signals are the command's own. It is
// looked for next to this twillctl (make build puts both in bin/), then
// on PATH.
func execLab(command string, args []string) error {
	path, err := findLab()
	if err != nil {
		return fmt.Errorf("%s: %w", command, err)
	}
	err = syscall.Exec(path, append([]string{path, command}, args...), os.Environ())
	return fmt.Errorf("%s: running %s: %w", command, path, err)
}

func findLab() (string, error) {
	self, err := os.Executable()
	if err == nil {
		p := filepath.Join(filepath.Dir(self), labBinary)
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	p, err := exec.LookPath(labBinary)
	if errors.Is(err, exec.ErrNotFound) {
		return "", fmt.Errorf("this command is in %s, which is not next to this twillctl nor on PATH "+
			"(the image's twillctl ships without it; build it with make build, or go build -o bin/ ./cmd/%s)", labBinary, labBinary)
	}
	return p, err
}
