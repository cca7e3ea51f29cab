#!/usr/bin/env bash
# overlap.sh [-w] [-g NICE] LOG BACKGROUND FOREGROUND: run the shell
# command BACKGROUND at the lowest CPU priority (nice 19), its output to LOG,
# while FOREGROUND runs as usual; then wait for BACKGROUND, print its log,
# and fail if either failed. If FOREGROUND fails (or this script is
# interrupted), BACKGROUND's process group, and only it, is stopped at once.
# -w waits for BACKGROUND when FOREGROUND fails rather than stop it: a
# benchmark's lab runs in sessions of its own, which the stop does not
# reach, and go test removes it only when the benchmark ends (interrupting
# the script still stops BACKGROUND). -g NICE also lowers the priority of
# BACKGROUND's scheduler autogroup (see below) to NICE, where the kernel has
# autogroups.
#
# make test builds the e2e tier's tools (the Kubernetes binaries, e2e.test,
# flanneld, etcdctl: about 20 minutes of compiling on a fresh 2-core
# machine) this way while lint, coverage and the unit tier run. Niced, the
# build mostly takes the CPU those leave idle, but not only: on a fresh
# 2-core machine (2026-11-26) they took 21 minutes beside it against 13
# alone, and the whole saved about 2 minutes; on warm caches the build is
# hidden entirely.
set -uo pipefail
group_nice= wait_on_failure=
if [ "${1:-}" = -w ]; then
	wait_on_failure=1
	shift
fi
if [ "${1:-}" = -g ]; then
	group_nice=${2:-}
	shift 2
fi
if [ $# != 3 ] || ! [[ "$group_nice" =~ ^([0-9]|1[0-9])?$ ]]; then
	echo "usage: overlap.sh [-w] [-g NICE (0-19)] LOG BACKGROUND FOREGROUND" >&2
	exit 2
fi
log=$1 bg=$2 fg=$3
mkdir -p "$(dirname "$log")"
# setsid: the background command leads a process group of its own, which
# stop signals as a whole (go build's compilers included). A new session
# is also a scheduler autogroup of its own where the kernel has them, and
# nice then orders only the processes inside it: the build takes about
# half the machine beside the foreground, as measured above. Lowering the
# autogroup's priority too (tried 2026-11-28) left the build to run after
# the foreground on a fresh machine, 10 minutes later to the e2e tier:
# lint and the unit tier leave almost no CPU idle. The e2e tier leaves
# about 45% of it idle (its lanes, e2e/share_test.go), and make test's
# work beside it takes -g: there the foreground must not wait for it.
run=$bg
if [ -n "$group_nice" ]; then
	run="{ [ ! -w /proc/self/autogroup ] || echo $group_nice >/proc/self/autogroup; } 2>/dev/null; $bg"
fi
setsid nice -n 19 bash -c "$run" >"$log" 2>&1 </dev/null &
pid=$!
stop() {
	kill -TERM -- "-$pid" 2>/dev/null
	wait "$pid" 2>/dev/null
}
trap 'stop; exit 130' INT TERM
echo "overlap: in the background, niced${group_nice:+, its autogroup at nice $group_nice} (log $log): $bg"
bash -c "$fg"
rc=$?
if [ "$rc" != 0 ] && [ -z "$wait_on_failure" ]; then
	stop
	echo "overlap: $fg failed; stopped the background command" >&2
	exit "$rc"
fi
echo "overlap: waiting for: $bg"
wait "$pid"
brc=$?
trap - INT TERM
sed 's/^/  | /' "$log"
if [ "$brc" != 0 ]; then
	echo "overlap: $bg failed (exit $brc)" >&2
fi
if [ "$rc" != 0 ]; then
	echo "overlap: $fg failed (exit $rc)" >&2
	exit "$rc"
fi
exit "$brc"
