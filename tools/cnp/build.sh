#!/usr/bin/env bash
# Fetch sigs.k8s.io/network-policy-api from the Go module proxy at the
# version go.mod pins and cache by version, in build/cnp/<version>/:
#   - its ClusterNetworkPolicy CRDs as released: crd-standard.yaml and
#     crd-experimental.yaml (the experimental channel adds the nodes and
#     domainNames peers and named ports); the Kubernetes labs install the
#     experimental one (twillctl lab up --crd);
#   - its conformance suite, the test binary conformance-nosctp.test
#     (twillctl lab conformance --suite cnp, make cnp). This machine's
#     kernel has no SCTP: every base pod of the suite runs two SCTP
#     servers, which cannot start, so no test could run. The binary is
#     built from a copy of the module whose conformance/base/manifests.yaml
#     lacks those ten containers and whose PokeServer logs an SCTP probe
#     instead of running it, and nothing else differs; the tests of SCTP
#     alone are left out of the run (Documentation/conformance.md).
# Nothing of the module is kept in this tree.
#
# CNP_SUITE=0 fetches the CRDs alone, which every Kubernetes lab installs;
# make test builds the suite beside the e2e tier, whose conformance subset
# alone runs it. Two runs at once take turns on each part (flock on a lock
# file in the output directory): a test that needs the suite waits for the
# build under way, up to 30 minutes, then finds it done.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
version=$(awk '$1 == "require" && $2 == "sigs.k8s.io/network-policy-api" {print $3}' "$here/go.mod")
out=${CNP_DIR:-$root/build/cnp/$version}
# build/cnp/current names the version in use, for the lab (twillctl lab up
# --kubernetes installs current/crd-experimental.yaml when there is one).
link() { [ -n "${CNP_DIR:-}" ] || ln -sfn "$version" "$(dirname "$out")/current"; }
stamp=$(cat "$here/go.mod" "$here/go.sum" "$0" | sha256sum | cut -c1-16)
mkdir -p "$out"
# lock NAME: hold $out/.NAME.lock until this script ends or the next lock.
lock() {
	exec 9>"$out/.$1.lock"
	flock -w 1800 9 || { echo "cnp: another build in $out held .$1.lock for 30 minutes" >&2; exit 1; }
}
src() { (cd "$here" && GOFLAGS=-mod=mod go mod download -json "sigs.k8s.io/network-policy-api@$version" | awk -F'"' '$2 == "Dir" {print $4}'); }
lock crd
if [ ! -f "$out/crd-standard.yaml" ] || [ ! -f "$out/crd-experimental.yaml" ]; then
	src=$(src)
	for ch in standard experimental; do
		f=$src/config/crd/$ch/policy.networking.k8s.io_clusternetworkpolicies.yaml
		[ -f "$f" ] || { echo "cnp: no $ch CRD in $src" >&2; exit 1; }
		cp "$f" "$out/.crd-$ch.yaml.$$"
		chmod u+w "$out/.crd-$ch.yaml.$$"
		mv "$out/.crd-$ch.yaml.$$" "$out/crd-$ch.yaml"
	done
fi
link
[ "${CNP_SUITE:-1}" != 0 ] || exit 0
lock suite
if [ -x "$out/conformance-nosctp.test" ] && [ "$(cat "$out/conformance-nosctp.test.stamp" 2>/dev/null)" = "$stamp" ]; then
	exit 0
fi
src=$(src)
echo "cnp: building the conformance suite $version into $out (the first time takes minutes)"
tmp=$(mktemp -d)
trap 'chmod -R u+w "$tmp"; rm -rf "$tmp"' EXIT
cp -r "$src" "$tmp/npa"
chmod -R u+w "$tmp/npa"
m=$tmp/npa/conformance/base/manifests.yaml
# A container block: "        - name: <pod>-9003" (or 9005, or the
# hostNetwork pod's two SCTP servers, its 7th and 8th host ports) up to the
# next container, the next document, or the end.
awk '/^        - name: [a-z-]+-900[35]$/ || /^        - name: centaur-\{\{ index \.HostNetworkPorts [67] \}\}$/ {skip = 1; n++; next}
	skip && (/^        - name: / || /^---/ || /^[^ ]/) {skip = 0}
	!skip {print}
	END {print n > "/dev/stderr"}' "$m" >"$m.new" 2>"$tmp/removed"
if [ "$(cat "$tmp/removed")" != 10 ]; then
	echo "cnp: expected to remove 10 SCTP containers from $m, removed $(cat "$tmp/removed")" >&2
	exit 1
fi
mv "$m.new" "$m"
# Its probes: an SCTP one is logged, not run (PokeServer would fail it, and
# the probes after it in the same test would not run).
h=$tmp/npa/conformance/utils/kubernetes/helper.go
awk '{print} /^func PokeServer\(t \*testing\.T, / {print "\tif protocol == \"sctp\" {\n\t\tt.Logf(\"SCTP probe of %s:%d not run: no SCTP in this kernel\", targetHost, targetPort)\n\t\treturn\n\t}"; n++}
	END {if (n != 1) exit 1}' "$h" >"$h.new" || { echo "cnp: no func PokeServer in $h" >&2; exit 1; }
mv "$h.new" "$h"
cp "$here/go.mod" "$here/go.sum" "$tmp/"
(cd "$here" && go mod edit -modfile "$tmp/go.mod" -replace "sigs.k8s.io/network-policy-api=$tmp/npa")
(cd "$here" && CGO_ENABLED=0 GOFLAGS=-mod=mod go test -modfile "$tmp/go.mod" -c -vet=off -trimpath -o "$out/.conformance.$$" sigs.k8s.io/network-policy-api/conformance)
mv "$out/.conformance.$$" "$out/conformance-nosctp.test"
echo "$stamp" >"$out/conformance-nosctp.test.stamp"
link
echo "cnp: ClusterNetworkPolicy CRDs and conformance suite $version in $out"
