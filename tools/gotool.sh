#!/usr/bin/env bash
# Build one binary of a tools module (tools/<dir>, its own go.mod) at the
# version that go.mod pins, and cache it by version:
# build/<cache>/<version>/<binary>, with build/<cache>/current naming the
# version (not when the directory is overridden). A second run with the same version does nothing. It ends by
# printing "<label>: <version> in <dir>" (e2e's builtTool reads that line).
#
#   gotool.sh <label> <module dir> <pinned module> <cache> <binary> <package> <cgo 0|1> [-ldflags extra]
#
# $<CACHE>_BIN_DIR (cache upper-cased) overrides the output directory;
# $GOTOOL_MODFILE, when set, is the go.mod the build reads instead of the
# module's own (go build -modfile); $GOTOOL_STAMP_FILE names one more file
# whose change rebuilds the binary.
set -euo pipefail
label=$1 dir=$2 module=$3 cache=$4 bin=$5 pkg=$6 cgo=$7 extra=${8:-}
root=$(cd "$(dirname "$0")/.." && pwd)
version=$(awk -v m="$module" '$1 == "require" && $2 == m {print $3}' "$dir/go.mod")
if [ -z "$version" ]; then
	echo "$label: $dir/go.mod has no 'require $module <version>' line" >&2
	exit 1
fi
override="$(echo "$cache" | tr '[:lower:]' '[:upper:]')_BIN_DIR"
out=${!override:-$root/build/$cache/$version}
# The binary is built again when the module's go.mod or go.sum changed
# since (tools/modalign raises a dependency, say), or $GOTOOL_STAMP_FILE
# did: a stamp holds their hash.
modsum=$(cat "$dir/go.mod" "$dir/go.sum" ${GOTOOL_STAMP_FILE:+"$GOTOOL_STAMP_FILE"} | sha256sum | cut -c1-16)
if [ ! -x "$out/$bin" ] || [ "$(cat "$out/$bin.modsum" 2>/dev/null)" != "$modsum" ]; then
	echo "$label: building $bin $version into $out (the first time takes minutes)"
	mkdir -p "$out"
	ldflags="-s -w${extra:+ $extra}"
	(cd "$dir" && CGO_ENABLED=$cgo GOFLAGS=-mod=mod go build -trimpath \
		${GOTOOL_MODFILE:+-modfile "$GOTOOL_MODFILE"} -ldflags "${ldflags//\{version\}/$version}" -o "$out/.$bin.$$" "$pkg")
	# Moved into place only once built, so a half-done build is never cached.
	mv "$out/.$bin.$$" "$out/$bin"
	echo "$modsum" > "$out/$bin.modsum"
fi
if [ -z "${!override:-}" ]; then ln -sfn "$version" "$(dirname "$out")/current"; fi
echo "$label: $version in $out"
