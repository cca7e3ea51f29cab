#!/usr/bin/env bash
# Build kube-apiserver and kubectl from the Go module proxy for the tests, and
# cache them by version: build/kube/<version>/{kube-apiserver,kubectl}.
# A second run with the same version does nothing.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
version=$(awk '$1 == "require" && $2 == "k8s.io/kubernetes" {print $3}' "$here/go.mod")
out=${KUBE_BIN_DIR:-$root/build/kube/$version}
if [ -x "$out/kube-apiserver" ] && [ -x "$out/kubectl" ]; then
	echo "kube tools: $version cached in $out"
	exit 0
fi
echo "kube tools: building kube-apiserver and kubectl $version into $out (a few minutes, once)"
mkdir -p "$out"
tmp=$(mktemp -d "$out/.build.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
ldflags="-s -w -X k8s.io/component-base/version.gitVersion=$version"
cd "$here"
CGO_ENABLED=0 GOFLAGS=-mod=mod go build -trimpath -ldflags "$ldflags" -o "$tmp/" \
	k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kubectl
# Move into place only when both built, so a half-done build is never "cached".
mv "$tmp/kube-apiserver" "$tmp/kubectl" "$out/"
echo "kube tools: done"
