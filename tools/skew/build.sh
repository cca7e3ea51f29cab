#!/usr/bin/env bash
# Build twill's image at an earlier commit of this repository's history, for
# the version-skew rollouts of the end-to-end tier (e2e/kubelab_skew_test.go):
# a cluster that runs it is rolled forward to the current build, so twilld,
# the CNI plugin and the WireGuard keeper of two versions meet. Cached by
# commit: build/skew/<commit>/twill.tar, the image twill.local/twill:skew-<short>.
#
# The commit is the previous round's last (2026-11-26), the build operators
# upgrade from; pass another as the first argument. The tree is taken with
# git archive (nothing is checked out here), built as make build and make
# image build it at that commit, with this tree's Debian package cache.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
commit=$(git -C "$root" rev-parse --verify "${1:-cfcb2b574b24e789bb0dd3f4c6b0cc7763f8025f}^{commit}")
short=${commit:0:7}
out=$root/build/skew/$commit
if [ -f "$out/twill.tar" ]; then
	echo "skew: twill.local/twill:skew-$short in $out"
	exit 0
fi
echo "skew: building twill at $short into $out (its binaries and image)"
mkdir -p "$out" "$root/build/debs"
src=$(mktemp -d "$out/.src.XXXXXX")
trap 'rm -rf "$src"' EXIT
git -C "$root" archive "$commit" | tar -x -C "$src"
(cd "$src" && export CGO_ENABLED=0 GOFLAGS=-trimpath &&
	go build -ldflags "-s -w -X github.com/twill-net/twill/internal/version.Version=$short" -o bin/ ./cmd/... &&
	go build -ldflags '-s -w' -o build/images/.pause ./tools/pause &&
	go run ./tools/mkimage -bin bin -pause build/images/.pause -debs "$root/build/debs" -out build/images -tag "skew-$short")
mv "$src/build/images/twill.tar" "$out/twill.tar.tmp"
for f in kube-twill.yml kube-twill-wireguard.yml; do cp "$src/dist/$f" "$out/$f"; done
mv "$out/twill.tar.tmp" "$out/twill.tar"
echo "skew: twill.local/twill:skew-$short in $out"
