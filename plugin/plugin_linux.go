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
	return skel.CNIFuncs{
		Add: withConf(cmdAdd), Del: withConf(cmdDel), Check: withConf(cmdCheck),
		Status: withConf(cmdStatus), GC: withConf(cmdGC),
	}
}

// withConf runs a verb on the network configuration on stdin, parsed.
func withConf(verb func(*skel.CmdArgs, *NetConf) error) func(*skel.CmdArgs) error {
	return func(args *skel.CmdArgs) error {
		c, err := ParseConf(args.StdinData)
		if err != nil {
			return err
		}
		return verb(args, c)
	}
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

// withHandles opens netlink handles on the pod's namespace and on the
// host's (this process's) namespace, runs fn with them and closes them.
func withHandles(netnsPath string, fn func(pod, host *nl.Handle) error) error {
	pod, err := nl.OpenPath(netnsPath)
	if err != nil {
		return fmt.Errorf("twill: pod network namespace %q: %w", netnsPath, err)
	}
	defer pod.Close()
	host, err := nl.Open("")
	if err != nil {
		return fmt.Errorf("twill: %w", err)
	}
	defer host.Close()
	return fn(pod, host)
}
