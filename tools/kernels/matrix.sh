#!/usr/bin/env bash
# matrix.sh [NAME...]: make test-kernels. Boots each kernel of
# kernels.list (or those named) under qemu's TCG emulator, all at once,
# each with checks.sh and twill's static binaries (bin/, as make build
# writes them, the e2e, policy, plugin, host-port and nftables-seam test
# binaries, and the reference plugins the plugin's tests chain), and fails
# unless every kernel booted and passed every check. Logs: build/kernels/logs/.
set -euo pipefail
cd "$(dirname "$0")/../.."
GO=${GO:-go}
names=("$@")
[ ${#names[@]} -gt 0 ] || mapfile -t names < <(awk '!/^#/ && NF {print $1}' tools/kernels/kernels.list)
# KVM_AT_ONCE bounds how many emulated machines run at once (below).
at_once=${KVM_AT_ONCE:-${#names[@]}}
[[ "$at_once" =~ ^[1-9][0-9]*$ ]] || { echo "matrix.sh: KVM_AT_ONCE=$at_once: want a count of machines, 1 or more" >&2; exit 2; }
logs=build/kernels/logs
mkdir -p "$logs"
bin=$(mktemp -d /tmp/twill-kernels-bin.XXXXXX)
trap 'rm -rf "$bin"' EXIT
cp bin/twill bin/twill-lab bin/twill-wg bin/twillctl bin/twilld bin/twilld-lab "$bin/"
for pkg in e2e policy plugin plugin/hostport nl/nft; do
	CGO_ENABLED=0 $GO test -c -trimpath -ldflags '-s -w' -o "$bin/${pkg##*/}.test" "./$pkg"
done
# The plugin's tests chain the reference plugins (internal/tools pins them).
CGO_ENABLED=0 $GO build -trimpath -ldflags '-s -w' -o "$bin/" github.com/containernetworking/plugins/plugins/main/ptp \
	github.com/containernetworking/plugins/plugins/ipam/host-local github.com/containernetworking/plugins/plugins/meta/portmap
dirs=()
for n in "${names[@]}"; do
	dirs+=("$(tools/kernels/fetch.sh "$n")")
done
# Every emulated machine at once, one vCPU each (vm.sh's 2 GiB each).
# Two at a time, then the third alone with both cores, left a fifth of
# the two cores idle for 10 minutes on a fresh machine (2026-11-29): a
# machine's checks wait as much as they compute, and one machine that
# ends early left its core idle until the other ended (KVM_AT_ONCE: all of
# them by default).
start=$(date +%s)
run() {
	local i=$1
	KVM_SMP=1 KVM_CPU=${KVM_CPU:-max,cx16=off} tools/kernels/vm.sh "${dirs[$i]}" "$bin" tools/kernels/checks.sh "$logs/${names[$i]}.log" \
		>"$logs/${names[$i]}.out" 2>&1
}
# report J RC: the machine's output and its verdict.
fail=0
report() {
	local j=$1 rc=$2 booted summary
	sed "s/^/${names[$j]}: /" "$logs/${names[$j]}.out" | tr -d '\033' | sed 's/\[[0-9;?]*[a-zA-Z]//g'
	booted=$(grep -so 'KVM uname -r: .*' "$logs/${names[$j]}.log" | head -1 | sed 's/KVM uname -r: //' | tr -d '\r' || true)
	summary=$(grep -sE '^KCHECKS ' "$logs/${names[$j]}.log" | tail -1 | tr -d '\r' || true)
	if [ "$rc" = 0 ]; then
		echo "test-kernels: ${names[$j]}: booted ${booted:-nothing}: ${summary#KCHECKS }: ok"
	else
		echo "test-kernels: ${names[$j]}: booted ${booted:-nothing}: ${summary#KCHECKS }: FAILED (console: $logs/${names[$j]}.log)"
		fail=1
	fi
}
for ((i = 0; i < ${#names[@]}; i += at_once)); do
	pids=()
	for ((j = i; j < i + at_once && j < ${#names[@]}; j++)); do
		run "$j" &
		pids+=("$!:$j")
	done
	for p in "${pids[@]}"; do
		rc=0
		wait "${p%%:*}" || rc=$?
		report "${p#*:}" "$rc"
	done
done
echo "test-kernels: ${#names[@]} kernels in $(($(date +%s) - start)) s"
# The failed checks again, last: what a reader of the run's tail sees.
if [ "$fail" != 0 ]; then
	for n in "${names[@]}"; do
		tr -d '\r' <"$logs/$n.log" 2>/dev/null | awk -v n="$n" '/^KCHECK/{show = /^KCHECK FAIL /} show {print "test-kernels: failed: " n ": " $0}' || true
	done
fi
exit $fail
