//go:build tools

// Package tools pins programs the tests build from the module proxy: the
// upstream CNI plugins used as chain partners and as the reference in the
// CNI benchmark. The build tag keeps them out of every real build.
package tools

import (
	_ "github.com/containernetworking/plugins/plugins/ipam/host-local"
	_ "github.com/containernetworking/plugins/plugins/main/ptp"
	_ "github.com/containernetworking/plugins/plugins/meta/portmap"
)
