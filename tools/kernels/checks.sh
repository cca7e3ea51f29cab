#!/bin/sh
# checks.sh runs inside make test-kernels' virtual machine, as root, on the
# kernel under test (vm.sh boots it with this script and twill's binaries
# in /twill/bin). Each check prints "KCHECK PASS|FAIL <name>"; the last line
# is "KCHECKS <n> passed, <m> failed", which vm.sh reads.
#
# KCHECKS_ONLY (a grep -E pattern over check names) narrows the run; KCOUNT
# runs TestEtcdWireGuard that many times (a flaky gap, looked into).
pass=0 fail=0
check() {
	name=$1
	shift
	if [ -n "${KCHECKS_ONLY:-}" ] && ! echo "$name" | grep -qE "$KCHECKS_ONLY"; then
		return
	fi
	start=$(date +%s)
	if "$@" >/tmp/check.out 2>&1; then
		pass=$((pass + 1))
		echo "KCHECK PASS $name ($(($(date +%s) - start)) s)"
		# What a Go test logged (its figures: gaps, the device used).
		grep -E '_test\.go:[0-9]+: |^\s*--- ' /tmp/check.out | head -40 | sed 's/^/  | /'
	else
		fail=$((fail + 1))
		echo "KCHECK FAIL $name ($(($(date +%s) - start)) s)"
		# What the test said first, then how the run ended.
		grep -E '_test\.go:[0-9]+: |^\s*--- ' /tmp/check.out | head -40 | sed 's/^/  | /'
		echo "  | ..."
		tail -60 /tmp/check.out | sed 's/^/  | /'
	fi
}

# lab BACKEND FAMILY NETFILTER: twillctl lab up, lab check and lab down, as
# make lab does; with wireguard, the nodes must use the kernel's device,
# and say so in twillctl status.
lab() {
	if ! twillctl lab up --name k --nodes 2 --pods-per-node 1 --backend "$1" --ip-family "$2" --netfilter "$3" --keep-on-failure; then
		# What the daemons said, then the lab removed.
		for f in /run/twill-lab/k/*.log; do
			[ -f "$f" ] || continue
			echo "--- $f (last 12 lines)"
			tail -12 "$f"
		done
		twillctl lab down --name k >/dev/null 2>&1
		return 1
	fi
	rc=0
	twillctl lab check --name k || rc=1
	if [ "$1" = wireguard ]; then
		twillctl lab exec --name k node1 -- ip -d link show twill-wg | grep -q 'wireguard' || { echo "node1's twill-wg is not a kernel WireGuard link"; rc=1; }
		st=$(twillctl lab exec --name k node1 -- twillctl status 2>&1)
		echo "$st" | grep -q 'twill-wg: kernel WireGuard' || { echo "twillctl status does not name the kernel device:"; echo "$st"; rc=1; }
	fi
	twillctl lab down --name k || rc=1
	return $rc
}

check "kernel has WireGuard (modprobe wireguard)" modprobe wireguard
for backend in vxlan host-gw wireguard; do
	check "lab $backend ipv4 nftables" lab "$backend" ipv4 nftables
	check "lab $backend dual iptables" lab "$backend" dual iptables
done
# Tests of twill's own suites, run from static test binaries against the
# same binaries (TWILL_TEST_BIN_DIR): the kernel device's drift, restart,
# rotation, stale-peer and capture checks; vxlan's checksum workaround with
# TCP across masquerade; the policy table and the plugin's host-port table
# (and traffic through it) on this kernel's nf_tables; and the nftables
# seam itself: its model against this kernel, its transactions' errors.
export TWILL_TEST_BIN_DIR=/twill/bin
# Waits are three times as long: the emulated CPU is several times slower
# than the machine. A held probe's gap may reach 3s instead of 1s (a loaded
# host stalls the emulator; WireGuard's own handshake retry is 5s).
export TWILL_E2E_WAIT_SCALE=3
cd /tmp
check "e2e TestEtcdWireGuard (kernel device)" e2e.test -test.run '^TestEtcdWireGuard$' -test.v -test.count ${KCOUNT:-1} -test.timeout 10m
check "e2e TestEtcdVXLANChecksumOffload" e2e.test -test.run '^TestEtcdVXLANChecksumOffload$' -test.v -test.count 1 -test.timeout 10m
check "nftables seam (nl/nft TestPrivileged*)" nft.test -test.run '^TestPrivileged' -test.v -test.count 1 -test.timeout 10m
check "policy table (TestPrivilegedPolicy*)" policy.test -test.run '^TestPrivilegedPolicy' -test.v -test.count 1 -test.timeout 10m
check "host-port table (hostport TestPrivileged*)" hostport.test -test.run '^TestPrivileged' -test.v -test.count 1 -test.timeout 10m
check "host ports through the plugin (TestPrivileged*HostPort*)" plugin.test -test.run '^TestPrivileged(HostPorts|UDPHostPort)' -test.v -test.count 1 -test.timeout 10m
echo "KCHECKS $pass passed, $fail failed"
