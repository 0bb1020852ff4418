#!/bin/sh
# mmdebstrap --customize-hook: runs on the host with the image root as $1.
set -eu
root="$1"

# qemu-guest-agent is in the image only as a benchmark peer: it must never
# start by itself (not by systemd, not by its udev rule, not by sysv init).
mkdir -p "$root/etc/systemd/system"
ln -sf /dev/null "$root/etc/systemd/system/qemu-guest-agent.service"
rm -f "$root"/lib/udev/rules.d/*qemu-guest-agent* "$root"/usr/lib/udev/rules.d/*qemu-guest-agent*
rm -f "$root/etc/init.d/qemu-guest-agent" "$root"/etc/rc?.d/*qemu-guest-agent*

# Identity of every rig; no network yet, so no resolver configuration.
echo rig >"$root/etc/hostname"
chmod 0644 "$root/etc/hostname"
printf '127.0.0.1\tlocalhost\n127.0.1.1\trig\n::1\tlocalhost ip6-localhost ip6-loopback\n' \
	>"$root/etc/hosts"
rm -f "$root/etc/resolv.conf"
# Empty, not absent: each rig's own boot may write one (clones must differ).
: >"$root/etc/machine-id"

# Trim what a rig never reads and what makes builds differ.
rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/*.bin "$root"/var/cache/debconf/*-old
rm -f "$root"/var/log/dpkg.log "$root"/var/log/alternatives.log "$root"/var/log/apt/*.log
rm -f "$root"/var/log/apt/eipp.log.xz
