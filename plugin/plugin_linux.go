package plugin

import (
	"errors"
	"fmt"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	"github.com/containernetworking/cni/pkg/version"

	"github.com/twill-net/twill/nl"
	"github.com/twill-net/twill/subnet"
)

// Funcs are the plugin's verbs for skel.PluginMainFuncs.
func Funcs() skel.CNIFuncs {
	return skel.CNIFuncs{Add: cmdAdd, Del: cmdDel, Check: cmdCheck, Status: cmdStatus, GC: cmdGC}
}

// Versions the plugin speaks.
func Versions() version.PluginInfo {
	return version.PluginSupports("0.3.1", "0.4.0", "1.0.0", "1.1.0")
}

func readEnv(c *NetConf) (subnet.Env, error) {
	env, err := subnet.ReadEnv(c.SubnetFile)
	if errors.Is(err, subnet.ErrNoEnv) {
		return env, types.NewError(types.ErrTryAgainLater,
			fmt.Sprintf("twill: %s does not exist: the twill daemon has not written it yet", c.SubnetFile),
			"start twilld on this node (or set subnetFile in the network configuration)")
	}
	if err != nil {
		return env, fmt.Errorf("twill: %w", err)
	}
	return env, nil
}

// openHandles opens netlink handles on the pod's namespace and on the
// node's (the plugin's own).
func openHandles(netnsPath string) (pod, host *nl.Handle, err error) {
	pod, err = nl.OpenPath(netnsPath)
	if err != nil {
		return nil, nil, fmt.Errorf("twill: pod network namespace %q: %w", netnsPath, err)
	}
	host, err = nl.Open("")
	if err != nil {
		pod.Close()
		return nil, nil, fmt.Errorf("twill: %w", err)
	}
	return pod, host, nil
}
