package app

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/spf13/cobra"
)

// newInstallCNICommand is what the DaemonSet's init containers run: it
// copies the plugin binary and the conflist onto the host. The image needs
// no shell or cp for it, and a half-written file is never seen by the
// container runtime (each copy is renamed into place).
func newInstallCNICommand() *cobra.Command {
	var plugin, binDir, conflist, confDir, confName string
	cmd := &cobra.Command{
		Use:   "install-cni",
		Short: "Copy the twill CNI plugin and/or its conflist onto the host (DaemonSet init containers)",
		Example: `  twilld install-cni --plugin=/usr/local/bin/twill --bin-dir=/host/opt/cni/bin
  twilld install-cni --conflist=/etc/kube-twill/cni-conf.json --conf-dir=/host/etc/cni/net.d`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if plugin == "" && conflist == "" {
				return errors.New("install-cni: give --plugin with --bin-dir, --conflist with --conf-dir, or both")
			}
			if plugin != "" {
				if binDir == "" {
					return errors.New("install-cni: --plugin needs --bin-dir")
				}
				dst := filepath.Join(binDir, filepath.Base(plugin))
				if err := installFile(plugin, dst, 0o755); err != nil {
					return err
				}
				fmt.Fprintln(cmd.OutOrStdout(), "installed", dst)
			}
			if conflist != "" {
				if confDir == "" {
					return errors.New("install-cni: --conflist needs --conf-dir")
				}
				dst := filepath.Join(confDir, confName)
				if err := installFile(conflist, dst, 0o644); err != nil {
					return err
				}
				fmt.Fprintln(cmd.OutOrStdout(), "installed", dst)
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&plugin, "plugin", "", "plugin binary to install")
	f.StringVar(&binDir, "bin-dir", "", "CNI binary directory (the host's /opt/cni/bin, mounted)")
	f.StringVar(&conflist, "conflist", "", "CNI conflist to install")
	f.StringVar(&confDir, "conf-dir", "", "CNI configuration directory (the host's /etc/cni/net.d, mounted)")
	f.StringVar(&confName, "conf-name", "10-twill.conflist", "file name of the installed conflist")
	return cmd
}

func installFile(src, dst string, mode os.FileMode) (err error) {
	in, err := os.Open(src)
	if err != nil {
		return fmt.Errorf("install-cni: %w", err)
	}
	defer in.Close()
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return fmt.Errorf("install-cni: %w", err)
	}
	tmp, err := os.CreateTemp(filepath.Dir(dst), "."+filepath.Base(dst)+".*")
	if err != nil {
		return fmt.Errorf("install-cni: %w", err)
	}
	defer func() {
		if err != nil {
			os.Remove(tmp.Name())
		}
	}()
	if _, err := io.Copy(tmp, in); err != nil {
		tmp.Close()
		return fmt.Errorf("install-cni: copying %s: %w", src, err)
	}
	if err := tmp.Chmod(mode); err != nil {
		tmp.Close()
		return fmt.Errorf("install-cni: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("install-cni: %w", err)
	}
	if err := os.Rename(tmp.Name(), dst); err != nil {
		return fmt.Errorf("install-cni: %w", err)
	}
	return nil
}
