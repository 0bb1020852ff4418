#!/bin/sh
# mmdebstrap --customize-hook for the computer (desktop) image: runs on the
# host as root with the image root as $1 and the recipe directory as $2
# (docs/images.md, "Desktop image").
set -eu
root="$1"
recipe="$2"
in_root() { chroot "$root" "$@"; }

# Our configuration files (lightdm autologin, Xorg, modprobe, units, skel).
cp -R --no-preserve=ownership "$recipe/rootfs/." "$root/"

# The user the session runs as: uid 1000, no password (autologin only),
# sudo without one (the agent is root anyway; this is the desktop's user).
in_root useradd --create-home --uid 1000 --user-group --shell /bin/bash \
	--groups audio,video,input,users rig
in_root passwd --lock rig >/dev/null
echo 'rig ALL=(ALL) NOPASSWD:ALL' >"$root/etc/sudoers.d/rig"
chmod 0440 "$root/etc/sudoers.d/rig"
# The panel's default layout, so it never asks on first start.
cfg="$root/home/rig/.config/xfce4/xfconf/xfce-perchannel-xml"
if [ -f "$root/etc/xdg/xfce4/panel/default.xml" ]; then
	cp "$root/etc/xdg/xfce4/panel/default.xml" "$cfg/xfce4-panel.xml"
fi
in_root chown -R rig:rig /home/rig

# The guest agent is not part of the image: it comes on the rig's tools disk,
# which our initramfs mounts read-only at /.rigd (so a change to the agent
# never rebuilds this image). The image's own python3 runs it as root from a
# unit that starts before sysinit.target (rigd-agent.service).
mkdir -p "$root/.rigd"
chmod 0755 "$root/.rigd"
in_root systemctl enable rigd-agent.service >/dev/null 2>&1
in_root systemctl set-default graphical.target >/dev/null 2>&1

# Units that cost boot time and do nothing useful in a rig. The serial
# console carries our markers only: no login prompt on it.
for unit in serial-getty@ttyS0.service getty@tty1.service \
	apt-daily.timer apt-daily-upgrade.timer man-db.timer e2scrub_all.timer \
	e2scrub_reap.service fstrim.timer systemd-networkd-wait-online.service \
	ModemManager.service wpa_supplicant.service; do
	ln -sf /dev/null "$root/etc/systemd/system/$unit"
done

# Benchmark peers only: qemu-guest-agent never starts by itself.
ln -sf /dev/null "$root/etc/systemd/system/qemu-guest-agent.service"
rm -f "$root"/lib/udev/rules.d/*qemu-guest-agent* "$root"/usr/lib/udev/rules.d/*qemu-guest-agent*
rm -f "$root/etc/init.d/qemu-guest-agent" "$root"/etc/rc?.d/*qemu-guest-agent*

# Root filesystem: the rig's disk is /dev/vda, mounted rw by the initramfs.
printf '/dev/vda\t/\text4\trw,noatime,errors=remount-ro\t0\t0\n' >"$root/etc/fstab"

# Identity of every rig; no network yet, so no resolver configuration.
echo rig >"$root/etc/hostname"
printf '127.0.0.1\tlocalhost\n127.0.1.1\trig\n::1\tlocalhost ip6-localhost ip6-loopback\n' \
	>"$root/etc/hosts"
rm -f "$root/etc/resolv.conf"
: >"$root/etc/machine-id"
rm -f "$root/var/lib/dbus/machine-id"

# Trim what a rig never reads and what makes builds differ.
rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/*.bin "$root"/var/cache/debconf/*-old
rm -f "$root"/var/log/dpkg.log "$root"/var/log/alternatives.log "$root"/var/log/apt/*.log
rm -f "$root"/var/log/apt/eipp.log.xz
