#!/usr/bin/env bash
# Build etcdctl from the Go module proxy at the version go.mod pins, and
# cache it by version: build/etcd/<version>/etcdctl. Documentation/etcd.md
# creates etcd's roles and users with it, and TestDocs runs those
# commands. A second run with the same version does nothing.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
version=$(awk '$1 == "require" && $2 == "go.etcd.io/etcd/etcdctl/v3" {print $3}' "$here/go.mod")
out=${ETCD_BIN_DIR:-$root/build/etcd/$version}
if [ -x "$out/etcdctl" ]; then
	echo "etcd tools: $version in $out"
	exit 0
fi
echo "etcd tools: building etcdctl $version into $out"
mkdir -p "$out"
(cd "$here" && CGO_ENABLED=0 GOFLAGS=-mod=mod go build -trimpath -ldflags "-s -w" \
	-o "$out/.etcdctl.$$" go.etcd.io/etcd/etcdctl/v3)
mv "$out/.etcdctl.$$" "$out/etcdctl"
ln -sfn "$version" "$(dirname "$out")/current" 2>/dev/null || true
echo "etcd tools: $version in $out"
