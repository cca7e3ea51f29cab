#!/usr/bin/env bash
# Build the Kubernetes binaries the tests and the lab run, from the Go module
# proxy, and cache them by version: build/kube/<version>/ holds
# kube-apiserver, kube-controller-manager, kube-scheduler, kubelet,
# kube-proxy, kubectl and crictl (tools/cri, its own version in the name of
# its stamp file). A second run with the same versions does nothing.
#
# The first build on a machine with an empty Go build cache takes 10 to 15
# minutes on 2 cores; later builds of a new version reuse most of the cache.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
version=$(awk '$1 == "require" && $2 == "k8s.io/kubernetes" {print $3}' "$here/go.mod")
crictl_version=$(awk '$1 == "require" && $2 == "sigs.k8s.io/cri-tools" {print $3}' "$root/tools/cri/go.mod")
out=${KUBE_BIN_DIR:-$root/build/kube/$version}
kube_bins="kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy kubectl"

missing=""
for b in $kube_bins; do [ -x "$out/$b" ] || missing="$missing $b"; done
if [ -n "$missing" ]; then
	echo "kube tools: building$missing $version into $out (the first time takes minutes)"
	mkdir -p "$out"
	tmp=$(mktemp -d "$out/.build.XXXXXX")
	trap 'rm -rf "$tmp"' EXIT
	ldflags="-s -w -X k8s.io/component-base/version.gitVersion=$version"
	pkgs=""
	for b in $missing; do pkgs="$pkgs k8s.io/kubernetes/cmd/$b"; done
	(cd "$here" && CGO_ENABLED=0 GOFLAGS=-mod=mod go build -trimpath -ldflags "$ldflags" -o "$tmp/" $pkgs)
	# Move into place only when all built, so a half-done build is never "cached".
	for b in $missing; do mv "$tmp/$b" "$out/"; done
	rm -rf "$tmp"
	trap - EXIT
fi
if [ ! -x "$out/crictl" ] || [ "$(cat "$out/crictl.version" 2>/dev/null)" != "$crictl_version" ]; then
	echo "kube tools: building crictl $crictl_version into $out"
	mkdir -p "$out"
	(cd "$root/tools/cri" && CGO_ENABLED=0 GOFLAGS=-mod=mod go build -trimpath -ldflags "-s -w" -o "$out/crictl.tmp" sigs.k8s.io/cri-tools/cmd/crictl)
	mv "$out/crictl.tmp" "$out/crictl"
	echo "$crictl_version" > "$out/crictl.version"
fi
# build/kube/current names the version in use, for the lab (twillctl lab up
# --kubernetes finds its binaries there next to bin/).
ln -sfn "$version" "$(dirname "$out")/current" 2>/dev/null || true
echo "kube tools: $version in $out"
