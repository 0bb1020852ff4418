#!/bin/sh
# mmdebstrap --customize-hook for a browser image: runs on the host as root
# with the image root as $1, the engine as $2 and the builder's Python as $3
# (docs/images.md, "Browser image").
set -eu
root="$1"
engine="$2"
python="${3:-python3}"
in_root() { chroot "$root" "$@"; }

# The browser runs as this user, never as root (the agent is root): uid 1000,
# no password, no login shell. Its profiles are throwaway directories in /tmp.
in_root useradd --create-home --uid 1000 --user-group --shell /usr/sbin/nologin \
	--groups audio browser
in_root passwd --lock browser >/dev/null

# What the image is, for the guest and for anyone reading the pack.
mkdir -p "$root/etc/rigd"
printf '{"format": "rigd.browser-image/v1", "engine": "%s"}\n' "$engine" >"$root/etc/rigd/browser.json"
chmod 0644 "$root/etc/rigd/browser.json"

# Nothing starts by itself: the agent is PID 1 (no init system), and the host
# starts the engine and (later) PulseAudio. Drop PulseAudio's autospawn anyway.
mkdir -p "$root/etc/pulse/client.conf.d"
echo 'autospawn = no' >"$root/etc/pulse/client.conf.d/00-rigd.conf"

# Identity of every rig; no network yet, so no resolver configuration.
echo rig >"$root/etc/hostname"
chmod 0644 "$root/etc/hostname"
printf '127.0.0.1\tlocalhost\n127.0.1.1\trig\n::1\tlocalhost ip6-localhost ip6-loopback\n' \
	>"$root/etc/hosts"
rm -f "$root/etc/resolv.conf"
# Empty, not absent: each rig's own boot may write one (clones must differ).
: >"$root/etc/machine-id"
rm -f "$root/var/lib/dbus/machine-id"

# Firefox's startup cache, compiled once here (natively) and copied into each rig's fresh
# profile by the launch script: its first session does not compile Firefox's own code again.
if [ "$engine" = firefox-esr ]; then
	"$python" "$(dirname "$0")/firefox_seed.py" "$root"
fi

# Trim what a rig never reads and what makes builds differ.
rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/*.bin "$root"/var/cache/debconf/*-old
rm -f "$root"/var/log/dpkg.log "$root"/var/log/alternatives.log "$root"/var/log/apt/*.log
rm -f "$root"/var/log/apt/eipp.log.xz
