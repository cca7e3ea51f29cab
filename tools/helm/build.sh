#!/usr/bin/env bash
# Build helm from the Go module proxy at the version go.mod pins, and cache
# it by version: build/helm/<version>/helm. make test lints and renders
# dist/chart/twill with it, and the Kubernetes lab installs twill with it
# (twillctl lab up --kubernetes --helm).
#
# go.mod replaces three of Helm's dependencies (semver, filepath-securejoin,
# go-pathrs) with the versions the Kubernetes binaries build with, so that
# both share one compile of them (tools/modalign): Helm's use of them is
# within the older versions' API.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# As Helm's own Makefile does: the Kubernetes version helm template and
# helm lint assume (without a cluster) is that of the client-go it links.
minor=$(awk '$1 == "k8s.io/client-go" {split($2, v, "."); print v[2]}' "$here/go.mod")
if [ -z "$minor" ]; then echo "helm: tools/helm/go.mod names no k8s.io/client-go version" >&2; exit 1; fi
k8s="-X helm.sh/helm/v3/pkg/chartutil.k8sVersionMajor=1 -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMinor=$minor"
k8s="$k8s -X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMajor=1 -X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMinor=$minor"
GOTOOL_STAMP_FILE=$here/build.sh exec bash "$here/../gotool.sh" "helm" "$here" helm.sh/helm/v3 \
	helm helm helm.sh/helm/v3/cmd/helm 0 \
	"-X helm.sh/helm/v3/internal/version.version={version} $k8s"
