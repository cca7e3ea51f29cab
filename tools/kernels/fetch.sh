#!/usr/bin/env bash
# fetch.sh NAME: print the directory holding kernel NAME of kernels.list,
# unpacked from Debian's package: boot/vmlinuz-<release> and
# lib/modules/<release>/. The package is downloaded with apt-get download
# through an apt state of its own under build/kernels/apt (the machine's
# sources, lists and /boot stay as they are), resolved from the suite's
# metapackage to the exact image package, and cached by its version:
# build/kernels/<package>_<version>/. Nothing is installed.
set -euo pipefail
cd "$(dirname "$0")/../.."
name=${1:?usage: fetch.sh NAME}
line=$(awk -v n="$name" '!/^#/ && $1 == n' tools/kernels/kernels.list)
[ -n "$line" ] || { echo "fetch.sh: no kernel $name in tools/kernels/kernels.list" >&2; exit 2; }
read -r _ suite meta <<<"$line"
case $suite in
*-security) uri=http://deb.debian.org/debian-security ;;
*) uri=http://deb.debian.org/debian ;;
esac
state=$PWD/build/kernels/apt/$suite
mkdir -p "$state/lists/partial" "$state/cache/archives/partial"
# One fetch of a suite at a time (make test fetches in the background while
# the matrix may start): the second finds the first's kernel cached.
exec 9>"$state/.lock"
flock -w 600 9 || { echo "fetch.sh: another fetch of $suite held its lock for 10 minutes" >&2; exit 1; }
echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $uri $suite main" >"$state/sources.list"
apt=(-o "Dir::Etc::SourceList=$state/sources.list" -o Dir::Etc::SourceParts=/dev/null
	-o "Dir::State::Lists=$state/lists" -o "Dir::Cache=$state/cache" -o Dir::State::status=/dev/null
	-o Debug::NoLocking=1 -o APT::Sandbox::User=root)
# The lists are refreshed once a day at most: a cached kernel needs none.
if [ -z "$(find "$state/lists" -maxdepth 1 -name '*Packages*' -mtime -1 2>/dev/null)" ]; then
	apt-get "${apt[@]}" -qq update >&2
fi
pkg=$(apt-cache "${apt[@]}" depends "$meta" 2>/dev/null | sed -n 's/^ *Depends: \(linux-image-[^ ]*\)$/\1/p' | grep -v -- '-dbg$' | head -1)
[ -n "$pkg" ] || { echo "fetch.sh: $meta in $suite depends on no linux-image package" >&2; exit 1; }
ver=$(apt-cache "${apt[@]}" show "$pkg" | sed -n 's/^Version: //p' | head -1)
dir=$PWD/build/kernels/${pkg}_${ver}
if [ ! -e "$dir/.done" ]; then
	rm -rf "$dir" && mkdir -p "$dir"
	tmp=$(mktemp -d)
	(cd "$tmp" && apt-get "${apt[@]}" -qq download "$pkg=$ver" >&2)
	dpkg-deb -x "$tmp"/*.deb "$dir"
	rm -rf "$tmp"
	touch "$dir/.done"
fi
echo "$dir"
