#!/usr/bin/env bash
# Build the Kubernetes binaries the tests and the lab run, from the Go module
# proxy, and cache them by version: build/kube/<version>/ holds
# kube-apiserver, kube-controller-manager, kube-scheduler, kubelet,
# kube-proxy, kubectl, and for Kubernetes' own end-to-end suite e2e.test
# and agnhost (its test image's binary) and regression-issue-74839 (another
# test image's server), all at the pinned version; crictl
# (tools/cri) and CoreDNS (tools/coredns, the lab's cluster DNS) are built
# at their own versions, named in stamp files next to them. A second run
# with the same versions does nothing.
#
# The first build on a machine with an empty Go build cache takes about 15-20
# minutes on 2 cores (seen on a fresh machine, 2026-11-26: 13 for the Go
# modules and the six binaries, 7 for e2e.test and agnhost before e2e.test
# was built without vet, 3.5 for crictl and CoreDNS before their modules
# shared the Kubernetes build's versions, tools/modalign; seconds since);
# later builds of a new version reuse most of the cache.
#
# KUBE_TOOLS_E2E=0 builds only what a Kubernetes lab runs (the six
# binaries, crictl, CoreDNS), not the e2e suite's e2e.test, agnhost and
# regression-issue-74839: make test builds those beside the e2e tier, which
# needs them only for its conformance subset, and the labs start meanwhile.
# Two runs at once take turns on each of the two parts (flock on a lock
# file in the output directory): a test that needs the suite waits for the
# build under way, up to 30 minutes, then finds it done.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
version=$(awk '$1 == "require" && $2 == "k8s.io/kubernetes" {print $3}' "$here/go.mod")
crictl_version=$(awk '$1 == "require" && $2 == "sigs.k8s.io/cri-tools" {print $3}' "$root/tools/cri/go.mod")
coredns_version=$(awk '$1 == "require" && $2 == "github.com/coredns/coredns" {print $3}' "$root/tools/coredns/go.mod")
out=${KUBE_BIN_DIR:-$root/build/kube/$version}
kube_bins="kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy kubectl"

ldflags="-s -w -X k8s.io/component-base/version.gitVersion=$version"
# Every binary here is built again when go.mod or go.sum changed since
# (tools/modalign raises a dependency, say): a stamp holds their hash.
modsum=$(cat "$here/go.mod" "$here/go.sum" | sha256sum | cut -c1-16)
mkdir -p "$out"
# lock NAME: hold $out/.NAME.lock until this script ends or the next lock.
lock() {
	exec 9>"$out/.$1.lock"
	flock -w 1800 9 || { echo "kube tools: another build in $out held .$1.lock for 30 minutes" >&2; exit 1; }
}
lock lab
if [ "$(cat "$out/go.modsum" 2>/dev/null)" != "$modsum" ]; then
	rm -f "$out"/kube-* "$out"/kubelet "$out"/kubectl "$out"/e2e.test "$out"/agnhost "$out"/regression-issue-74839
fi
missing=""
for b in $kube_bins; do [ -x "$out/$b" ] || missing="$missing $b"; done
if [ -n "$missing" ]; then
	echo "kube tools: building$missing $version into $out (the first time takes minutes)"
	mkdir -p "$out"
	tmp=$(mktemp -d "$out/.build.XXXXXX")
	trap 'rm -rf "$tmp"' EXIT
	pkgs=""
	for b in $missing; do pkgs="$pkgs k8s.io/kubernetes/cmd/$b"; done
	(cd "$here" && CGO_ENABLED=0 GOFLAGS=-mod=mod go build -trimpath -ldflags "$ldflags" -o "$tmp/" $pkgs)
	# Move into place only when all built, so a half-done build is never "cached".
	for b in $missing; do mv "$tmp/$b" "$out/"; done
	rm -rf "$tmp"
	trap - EXIT
fi
# tool_at_version builds a tool of its own module at the version its go.mod
# pins, when the stamp next to the binary names another, or when the
# module's own source (its plugin list, say), go.mod or go.sum changed
# since: a second stamp holds their hash.
tool_at_version() { # name version module-dir package
	src=$(cat "$3"/*.go "$3"/go.mod "$3"/go.sum | sha256sum | cut -c1-16)
	if [ -x "$out/$1" ] && [ "$(cat "$out/$1.version" 2>/dev/null)" = "$2" ] &&
		[ "$(cat "$out/$1.source" 2>/dev/null)" = "$src" ]; then return; fi
	echo "kube tools: building $1 $2 into $out"
	mkdir -p "$out"
	(cd "$3" && CGO_ENABLED=0 GOFLAGS=-mod=mod go build -trimpath -ldflags "-s -w" -o "$out/.$1.$$" "$4")
	mv "$out/.$1.$$" "$out/$1"
	echo "$2" > "$out/$1.version"
	echo "$src" > "$out/$1.source"
}
tool_at_version crictl "$crictl_version" "$root/tools/cri" sigs.k8s.io/cri-tools/cmd/crictl
tool_at_version coredns "$coredns_version" "$root/tools/coredns" .
# The stamp, under the lab part's lock: the next run must not take what the
# suite's part builds meanwhile for stale.
echo "$modsum" > "$out/go.modsum"
# build/kube/current names the version in use, for the lab (twillctl lab up
# --kubernetes finds its binaries there next to bin/).
ln -sfn "$version" "$(dirname "$out")/current" 2>/dev/null || true
if [ "${KUBE_TOOLS_E2E:-1}" != 0 ]; then
	lock e2e
	# e2e.test is a test binary (go test -c), built without go vet: go test -c
	# vets the package, which first computes vet's facts for each of its
	# thousands of dependencies, about 5 of the 7 minutes the build took on a
	# fresh machine. agnhost goes into the e2e images, with the TLS pair its
	# porter serves from its working directory (upstream's image has them in /).
	if [ ! -x "$out/e2e.test" ] || [ ! -x "$out/agnhost" ] || [ ! -f "$out/agnhost-localhost.key" ]; then
		echo "kube tools: building e2e.test and agnhost $version into $out"
		mkdir -p "$out"
		(cd "$here" && CGO_ENABLED=0 GOFLAGS=-mod=mod go test -c -vet=off -trimpath -ldflags "$ldflags" -o "$out/.e2e.test.$$" k8s.io/kubernetes/test/e2e)
		(cd "$here" && CGO_ENABLED=0 GOFLAGS=-mod=mod go build -trimpath -ldflags "-s -w" -o "$out/.agnhost.$$" k8s.io/kubernetes/test/images/agnhost)
		src=$(cd "$here" && GOFLAGS=-mod=mod go list -m -f '{{.Dir}}' k8s.io/kubernetes)
		for f in crt key; do cp "$src/test/images/agnhost/porter/localhost.$f" "$out/agnhost-localhost.$f"; done
		mv "$out/.e2e.test.$$" "$out/e2e.test"
		mv "$out/.agnhost.$$" "$out/agnhost"
	fi
	# The server of the e2e image regression-issue-74839 (the Conntrack spec
	# for packets conntrack calls invalid).
	if [ ! -x "$out/regression-issue-74839" ]; then
		echo "kube tools: building regression-issue-74839 $version into $out"
		(cd "$here" && CGO_ENABLED=0 GOFLAGS=-mod=mod go build -trimpath -ldflags "-s -w" -o "$out/.regression.$$" k8s.io/kubernetes/test/images/regression-issue-74839)
		mv "$out/.regression.$$" "$out/regression-issue-74839"
	fi
fi
echo "kube tools: $version in $out"
