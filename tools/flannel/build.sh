#!/usr/bin/env bash
# Build flanneld from the Go module proxy at the version go.mod pins, and
# cache it by version: build/flannel/<version>/flanneld. The flannel-takeover
# tests (e2e/flannel_test.go) run it as the cluster's previous network.
#
# flanneld is built without cgo, as the Kubernetes binaries are, so that it
# reuses their compiled packages (tools/modalign keeps the versions equal).
# Its udp backend's packet proxy is C: the build compiles flannel's module
# from a temporary copy, with udpnocgo/udp_nocgo.go added to its
# pkg/backend/udp for the proxy's four functions, and that backend does not
# forward in this build; the tests run vxlan and host-gw. Tencent Cloud's
# SDK is replaced by stand-ins (go.mod). Nothing of flannel's code is kept
# in this tree.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# The copy is made on every run (flannel's module is 4 MB); gotool.sh
# decides whether to build, and the stand-in is part of its stamp.
src=$(cd "$here" && GOFLAGS=-mod=mod go mod download -json "$(awk '$1 == "require" && $2 == "github.com/flannel-io/flannel" {print $2 "@" $3}' "$here/go.mod")" | awk -F'"' '$2 == "Dir" {print $4}')
if [ ! -d "$src/pkg/backend/udp" ]; then
	echo "flannel: no pkg/backend/udp in flannel's module ($src)" >&2
	exit 1
fi
tmp=$(mktemp -d)
trap 'chmod -R u+w "$tmp"; rm -rf "$tmp"' EXIT
cp -r "$src" "$tmp/flannel"
chmod -R u+w "$tmp/flannel"
cp "$here/udpnocgo/udp_nocgo.go" "$tmp/flannel/pkg/backend/udp/"
cp "$here/go.mod" "$here/go.sum" "$tmp/"
(cd "$here" && go mod edit -modfile "$tmp/go.mod" -replace "github.com/flannel-io/flannel=$tmp/flannel")
GOTOOL_MODFILE=$tmp/go.mod GOTOOL_STAMP_FILE=$here/udpnocgo/udp_nocgo.go bash "$here/../gotool.sh" flannel "$here" github.com/flannel-io/flannel \
	flannel flanneld github.com/flannel-io/flannel 0 \
	"-X github.com/flannel-io/flannel/pkg/version.Version={version}"
