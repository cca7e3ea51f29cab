#!/usr/bin/env bash
# vm.sh KERNEL_DIR BIN_DIR CHECKS LOG: boot the Debian kernel unpacked in
# KERNEL_DIR (fetch.sh) under qemu's TCG emulator, with an initramfs of
# busybox, the tools the lab runs (iproute2, nft, iptables, nsenter, ping,
# kmod as modprobe), the kernel's network modules, twill's static binaries
# from BIN_DIR, and the shell script CHECKS, which the VM runs as root, then
# powers off. The console goes to LOG. Exits 0 when the VM said
# "KCHECKS n passed, 0 failed" with n > 0.
#
# Nothing is installed on the machine: the kernel and its modules stay in
# KERNEL_DIR and the VM's memory. TCG, not KVM: nested KVM hangs at boot on
# these machines.
set -euo pipefail
kdir=$1 bin=$2 checks=$3 log=$4
release=$(basename "$(ls -d "$kdir"/lib/modules/*)")
work=$(mktemp -d /tmp/twill-kvm.XXXXXX)
trap 'rm -rf "$work"' EXIT
root=$work/root
mkdir -p "$root"/{bin,sbin,usr/bin,usr/sbin,proc,sys,dev,run,tmp,etc,lib/modules,twill/bin,var}
ln -s ../run "$root/var/run"
# Tools, with their libraries where they are dynamically linked, and for
# iptables its extensions.
copy() {
	local f
	for f in "$@"; do
		mkdir -p "$root$(dirname "$f")"
		cp -L "$f" "$root$f"
		{ ldd "$f" 2>/dev/null || true; } | awk '/=>/ && $3 ~ /^\// {print $3} /^\t\/[^ ]*ld-linux/ {print $1}' | while read -r l; do
			[ -e "$root$l" ] || { mkdir -p "$root$(dirname "$l")"; cp -L "$l" "$root$l"; }
		done
	done
}
copy /bin/busybox /usr/sbin/ip /usr/sbin/bridge /usr/sbin/nft /usr/sbin/xtables-nft-multi /usr/sbin/ethtool /usr/bin/iperf3 /usr/bin/nsenter /usr/bin/ping /usr/bin/kmod
for a in sh mount sysctl umount mkdir cat echo poweroff sleep ls ln rm cp grep sed awk tail head wc date uname env seq tr cut sort kill ps mktemp true false test printf chmod touch dirname basename tee timeout hostname; do
	ln -sf busybox "$root/bin/$a"
done
for l in /usr/lib/x86_64-linux-gnu/xtables/*.so; do copy "$l"; done
for t in iptables iptables-save iptables-restore ip6tables ip6tables-save ip6tables-restore; do ln -sf xtables-nft-multi "$root/usr/sbin/$t"; done
for t in modprobe lsmod insmod depmod; do ln -sf ../usr/bin/kmod "$root/sbin/$t"; done
# The kernel's network modules and what they need; depmod writes their
# index as an installed kernel has it.
mkdir -p "$root/lib/modules/$release/kernel"
for d in net drivers/net lib crypto arch virt mm; do
	[ -d "$kdir/lib/modules/$release/kernel/$d" ] || continue
	mkdir -p "$root/lib/modules/$release/kernel/$(dirname "$d")"
	cp -a "$kdir/lib/modules/$release/kernel/$d" "$root/lib/modules/$release/kernel/$d"
done
cp "$kdir/lib/modules/$release"/modules.{order,builtin}* "$root/lib/modules/$release/" 2>/dev/null || true
depmod -b "$root" "$release" 2>/dev/null
cp "$bin"/* "$root/twill/bin/"
cp "$checks" "$root/checks.sh"
# What the checks are told (vm.sh's environment: KCHECKS_ONLY, KCOUNT).
printf 'KCHECKS_ONLY=%s\n' "'${KCHECKS_ONLY:-}'" >"$root/checks.env"
printf 'KCOUNT=%s\n' "'${KCOUNT:-1}'" >>"$root/checks.env"
printf 'root:x:0:0:root:/root:/bin/sh\n' >"$root/etc/passwd"
printf 'root:x:0:\n' >"$root/etc/group"
printf '127.0.0.1 localhost\n::1 localhost\n' >"$root/etc/hosts"
cat >"$root/init" <<'INIT'
#!/bin/sh
export PATH=/twill/bin:/sbin:/usr/sbin:/bin:/usr/bin HOME=/root
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
mkdir -p /dev/pts /dev/shm /dev/net && mount -t devpts devpts /dev/pts
mount -t tmpfs tmpfs /run && mount -t tmpfs tmpfs /tmp && mkdir -p /root
mount -t cgroup2 none /sys/fs/cgroup 2>/dev/null
ip link set lo up
echo "KVM uname -r: $(uname -r)"
set -a && . /checks.env && set +a
sh /checks.sh 2>&1
poweroff -f
INIT
chmod +x "$root/init" "$root/checks.sh"
(cd "$root" && find . | cpio -o -H newc 2>/dev/null) >"$work/initrd"
mem=${KVM_MEM:-2048} smp=${KVM_SMP:-1}
echo "vm.sh: booting $release (TCG, $smp vCPU, ${mem} MiB), initramfs $(du -h "$work/initrd" | cut -f1), console in $log"
# -no-reboot with panic=-1: a kernel panic ends qemu instead of looping.
# initramfs_async=0: 6.12 under qemu 7.2's TCG double-faults now and then
# while it unpacks the initramfs beside driver start-up (2 boots in 6 with
# it, none in 10 without). A boot that panics before the first check is
# tried once more; a check's failure never is.
boot() {
	timeout "${KVM_TIMEOUT:-900}" qemu-system-x86_64 -accel tcg,thread=multi -cpu "${KVM_CPU:-max}" -smp "$smp" -m "$mem" \
		-nographic -no-reboot -nic none \
		-kernel "$kdir/boot/vmlinuz-$release" -initrd "$work/initrd" \
		-append "console=ttyS0 quiet loglevel=3 panic=-1 mitigations=off initramfs_async=0 ${KVM_APPEND:-}" </dev/null >"$log" 2>&1 || true
}
boot
if ! grep -q '^KCHECK' "$log" && grep -q 'Kernel panic' "$log"; then
	echo "vm.sh: $release panicked before its first check; booting it once more (the panic: $log.first)"
	mv "$log" "$log.first"
	boot
fi
tr -d '\r' <"$log" >"$log.txt" && mv "$log.txt" "$log"
grep -E 'KVM uname|^KCHECK|^  \| ' "$log" || true
summary=$(grep -E '^KCHECKS [0-9]+ passed, [0-9]+ failed' "$log" | tail -1)
[ -n "$summary" ] || { echo "vm.sh: $release: the VM did not report its checks (see $log)" >&2; exit 1; }
read -r _ passed _ failed _ <<<"$summary"
[ "$failed" = 0 ] && [ "$passed" -gt 0 ]
