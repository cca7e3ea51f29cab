// Package dist holds what twill ships for users to install: the Kubernetes
// manifest, its Helm chart, the CNI conflist, the sample net-conf.json. They are embedded
// here so that the lab installs the very files users install, not copies.
package dist

import "embed"

// KubeManifest is kube-twill.yml.
//
//go:embed kube-twill.yml
var KubeManifest []byte

// WireGuardKeeperManifest is kube-twill-wireguard.yml: the userspace
// WireGuard keeper, for kernels without the wireguard module.
//
//go:embed kube-twill-wireguard.yml
var WireGuardKeeperManifest []byte

// Chart is the Helm chart, under chart/twill. The lab installs it from
// here (lab up --kubernetes --helm), as users install it from the tree.
//
//go:embed all:chart/twill
var Chart embed.FS

// ChartDir is the chart's directory in Chart.
const ChartDir = "chart/twill"

// Conflist is 10-twill.conflist.
//
//go:embed 10-twill.conflist
var Conflist []byte

// ShippedImage is the image reference kube-twill.yml names; installers
// replace it with their own build.
const ShippedImage = "ghcr.io/twill-net/twill:v0.1.0"
