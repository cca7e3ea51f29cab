package app

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/containernetworking/cni/libcni"
	"github.com/spf13/cobra"

	"github.com/twill-net/twill/internal/atomicfile"
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
				data, err := readConflist(conflist)
				if err != nil {
					return err
				}
				if err := atomicfile.Write(dst, data, 0o644); err != nil {
					return fmt.Errorf("install-cni: %w", err)
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

// readConflist reads a CNI conflist and checks it the way the runtime
// will read it (libcni), and that it chains the twill plugin, so a broken
// file is refused here rather than making every pod on the node fail.
func readConflist(path string) ([]byte, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("CNI conflist: %w", err)
	}
	list, err := libcni.ConfListFromBytes(data)
	if err != nil {
		return nil, fmt.Errorf("CNI conflist %s: %w", path, err)
	}
	for _, p := range list.Plugins {
		if p.Network.Type == "twill" {
			return data, nil
		}
	}
	return nil, fmt.Errorf("CNI conflist %s: no plugin of type \"twill\" in %q", path, list.Name)
}

// conflistStore is the network name and the twill plugin's dataDir in a
// conflist readConflist accepted (dataDir when the plugin sets none).
func conflistStore(data []byte, dataDir string) (network, dir string) {
	list, err := libcni.ConfListFromBytes(data)
	if err != nil {
		return "", dataDir
	}
	for _, p := range list.Plugins {
		if p.Network.Type != "twill" {
			continue
		}
		var c struct {
			DataDir string `json:"dataDir"`
		}
		if json.Unmarshal(p.Bytes, &c) == nil && c.DataDir != "" {
			dataDir = c.DataDir
		}
	}
	return list.Name, dataDir
}

func installFile(src, dst string, mode os.FileMode) error {
	in, err := os.Open(src)
	if err != nil {
		return fmt.Errorf("install-cni: %w", err)
	}
	defer in.Close()
	if err := atomicfile.WriteFrom(dst, func(w io.Writer) error { _, err := io.Copy(w, in); return err }, mode); err != nil {
		return fmt.Errorf("install-cni: %w", err)
	}
	return nil
}
