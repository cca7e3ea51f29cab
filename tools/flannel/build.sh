#!/usr/bin/env bash
# Build flanneld from the Go module proxy at the version go.mod pins, and
# cache it by version: build/flannel/<version>/flanneld. The flannel-takeover
# tests (e2e/flannel_test.go) run it as the cluster's previous network. A
# second run with the same version does nothing.
#
# flanneld's udp backend is written with cgo, so it is built with cgo (gcc).
# Tencent Cloud's SDK is replaced by stand-ins (go.mod); nothing of
# flannel's code is kept in this tree.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
version=$(awk '$1 == "require" && $2 == "github.com/flannel-io/flannel" {print $3}' "$here/go.mod")
out=${FLANNEL_BIN_DIR:-$root/build/flannel/$version}
if [ -x "$out/flanneld" ]; then
	echo "flannel: $version in $out"
	exit 0
fi
echo "flannel: building flanneld $version into $out (the first time takes minutes)"
mkdir -p "$out"
(cd "$here" && CGO_ENABLED=1 GOFLAGS=-mod=mod go build -trimpath \
	-ldflags "-s -w -X github.com/flannel-io/flannel/pkg/version.Version=$version" \
	-o "$out/.flanneld.$$" github.com/flannel-io/flannel)
mv "$out/.flanneld.$$" "$out/flanneld"
ln -sfn "$version" "$(dirname "$out")/current" 2>/dev/null || true
echo "flannel: $version in $out"
