#!/usr/bin/env bash
# Fetch sigs.k8s.io/network-policy-api from the Go module proxy at the
# version go.mod pins and cache by version, in build/cnp/<version>/, its
# ClusterNetworkPolicy CRDs as released: crd-standard.yaml and
# crd-experimental.yaml (the experimental channel adds the nodes and
# domainNames peers and named ports). The Kubernetes labs of the tests
# install the experimental one (twillctl lab up --crd). Nothing of the
# module is kept in this tree.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
version=$(awk '$1 == "require" && $2 == "sigs.k8s.io/network-policy-api" {print $3}' "$here/go.mod")
out=${CNP_DIR:-$root/build/cnp/$version}
# build/cnp/current names the version in use, for the lab (twillctl lab up
# --kubernetes installs current/crd-experimental.yaml when there is one).
link() { [ -n "${CNP_DIR:-}" ] || ln -sfn "$version" "$(dirname "$out")/current"; }
if [ -f "$out/crd-standard.yaml" ] && [ -f "$out/crd-experimental.yaml" ]; then
	link
	exit 0
fi
src=$(cd "$here" && GOFLAGS=-mod=mod go mod download -json "sigs.k8s.io/network-policy-api@$version" | awk -F'"' '$2 == "Dir" {print $4}')
mkdir -p "$out"
for ch in standard experimental; do
	f=$src/config/crd/$ch/policy.networking.k8s.io_clusternetworkpolicies.yaml
	[ -f "$f" ] || { echo "cnp: no $ch CRD in $src" >&2; exit 1; }
	cp "$f" "$out/.crd-$ch.yaml.$$"
	mv "$out/.crd-$ch.yaml.$$" "$out/crd-$ch.yaml"
done
link
echo "cnp: ClusterNetworkPolicy CRDs $version in $out"
