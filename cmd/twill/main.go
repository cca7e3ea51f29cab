// Command twill is the twill CNI plugin (CNI "type": "twill").
package main

import (
	"runtime"

	"github.com/containernetworking/cni/pkg/skel"

	"github.com/twill-net/twill/internal/version"
	"github.com/twill-net/twill/plugin"
)

func init() {
	// Namespace work must stay on one OS thread; CNI plugins lock the main
	// thread before anything else runs.
	runtime.LockOSThread()
}

func main() {
	skel.PluginMainFuncs(plugin.Funcs(), plugin.Versions(), "twill CNI plugin "+version.Version)
}
