//go:build tools

// Package tools pins Helm, whose chart twill ships in dist/chart/twill:
// make test lints and renders the chart with it and installs twill with it
// in the Kubernetes lab (see build.sh). It is a module of its own so that
// Helm's dependencies never move twill's.
package tools

import _ "helm.sh/helm/v3/cmd/helm"
