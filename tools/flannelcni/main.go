// Command flannelcni stands in for flannel's CNI plugin (type "flannel"),
// which the Go module proxy does not serve, in the Kubernetes lab's
// kube-flannel DaemonSet: like it, it reads flanneld's subnet.env at ADD
// and delegates to the reference bridge plugin (cni0, gateway, hairpin,
// host-local over the node's subnet, a route to the cluster Network),
// keeping the delegate's configuration so that DEL works after subnet.env
// is gone. It is a test tool of twill's, written from flannel's documented
// behaviour; none of flannel's code is in it.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/containernetworking/cni/pkg/invoke"
	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	"github.com/containernetworking/cni/pkg/version"
)

type conf struct {
	types.NetConf
	SubnetFile string `json:"subnetFile"`
	DataDir    string `json:"dataDir"`
}

func main() {
	if len(os.Args) == 5 && os.Args[1] == "install" {
		if err := install(os.Args[2], os.Args[3], os.Args[4]); err != nil {
			fmt.Fprintln(os.Stderr, "flannelcni install:", err)
			os.Exit(1)
		}
		return
	}
	skel.PluginMainFuncs(skel.CNIFuncs{Add: add, Del: del, Check: check}, version.All, "twill's stand-in for flannel's CNI plugin")
}

func load(args *skel.CmdArgs) (conf, error) {
	c := conf{SubnetFile: "/run/flannel/subnet.env", DataDir: "/var/lib/cni/flannel"}
	if err := json.Unmarshal(args.StdinData, &c); err != nil {
		return c, fmt.Errorf("flannel stand-in: %w", err)
	}
	return c, nil
}

// delegate is the bridge configuration flannel's plugin hands on.
func delegate(c conf) ([]byte, error) {
	env, err := readEnv(c.SubnetFile)
	if err != nil {
		return nil, err
	}
	sub, err := netip.ParsePrefix(env["FLANNEL_SUBNET"])
	if err != nil {
		return nil, fmt.Errorf("flannel stand-in: FLANNEL_SUBNET %q in %s: %w", env["FLANNEL_SUBNET"], c.SubnetFile, err)
	}
	mtu, _ := strconv.Atoi(env["FLANNEL_MTU"])
	d := map[string]any{
		"cniVersion": c.CNIVersion, "name": c.Name, "type": "bridge", "bridge": "cni0",
		"isGateway": true, "isDefaultGateway": true, "hairpinMode": true, "ipMasq": env["FLANNEL_IPMASQ"] != "true", "mtu": mtu,
		"ipam": map[string]any{"type": "host-local", "ranges": [][]map[string]string{{{"subnet": sub.Masked().String()}}},
			"routes": []map[string]string{{"dst": env["FLANNEL_NETWORK"]}}},
	}
	return json.Marshal(d)
}

func add(args *skel.CmdArgs) error {
	c, err := load(args)
	if err != nil {
		return err
	}
	d, err := delegate(c)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(c.DataDir, 0o700); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(c.DataDir, args.ContainerID), d, 0o600); err != nil {
		return err
	}
	r, err := invoke.DelegateAdd(context.Background(), "bridge", d, nil)
	if err != nil {
		return err
	}
	return types.PrintResult(r, c.CNIVersion)
}

func del(args *skel.CmdArgs) error {
	c, err := load(args)
	if err != nil {
		return err
	}
	saved := filepath.Join(c.DataDir, args.ContainerID)
	d, err := os.ReadFile(saved)
	if os.IsNotExist(err) {
		return nil // never added, or already deleted
	}
	if err != nil {
		return err
	}
	if err := invoke.DelegateDel(context.Background(), "bridge", d, nil); err != nil {
		return err
	}
	return os.Remove(saved)
}

func check(args *skel.CmdArgs) error {
	c, err := load(args)
	if err != nil {
		return err
	}
	d, err := os.ReadFile(filepath.Join(c.DataDir, args.ContainerID))
	if err != nil {
		return err
	}
	return invoke.DelegateCheck(context.Background(), "bridge", d, nil)
}

// install is the DaemonSet's init container: it copies this binary (as
// "flannel") and the bridge and host-local plugins beside it onto the
// host's CNI directory, and the conflist to confDest, each written to a
// temporary file and renamed.
func install(conflist, binDir, confDest string) error {
	self, err := os.Executable()
	if err != nil {
		return err
	}
	for src, name := range map[string]string{self: "flannel", filepath.Join(filepath.Dir(self), "bridge"): "bridge",
		filepath.Join(filepath.Dir(self), "host-local"): "host-local"} {
		if err := copyFile(src, filepath.Join(binDir, name), 0o755); err != nil {
			return err
		}
	}
	return copyFile(conflist, confDest, 0o644)
}

func copyFile(src, dst string, mode os.FileMode) error {
	data, err := os.ReadFile(src)
	if err != nil {
		return err
	}
	tmp := dst + ".tmp"
	if err := os.WriteFile(tmp, data, mode); err != nil {
		return err
	}
	return os.Rename(tmp, dst)
}

// readEnv reads flanneld's subnet.env (KEY=value lines).
func readEnv(path string) (map[string]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("flannel stand-in: %w (is flanneld running?)", err)
	}
	defer f.Close()
	env := map[string]string{}
	s := bufio.NewScanner(f)
	for s.Scan() {
		if k, v, ok := strings.Cut(strings.TrimSpace(s.Text()), "="); ok {
			env[k] = v
		}
	}
	return env, s.Err()
}
