"""What a browser rig runs inside its guest, as shell scripts the agent's ``exec`` runs:
each engine's launch (as the unprivileged ``browser`` user, a throwaway profile, the
guest-loopback DevTools relay beside it), the probe that asks DevTools through that relay,
the port relay from the rig's virtio-serial port, and the watch that returns when the engine
exits. Pure: strings from constants; :mod:`rigd.backends.browser` runs them.
"""

from __future__ import annotations

import json
import shlex
from typing import Any

from rigd.backends.lanes import DropTarget
from rigd.browser.firefox import user_js
from rigd.browser.page import QUIET_URL
from rigd.browser.webkit import MINIBROWSER_GTK_CSS

#: Where Chromium's DevTools listens inside the guest (loopback only).
GUEST_DEVTOOLS_PORT = 9223
#: The relay in front of it (guest loopback), which the rig's DevTools port reaches (RIGS.md §3).
RELAY_PORT = 9222
#: The virtio-serial port that is the one host-side path to guest 9222, and its socket in the
#: rig's directory (QEMU listens; only rigd connects: the directory is the rig's, 0700).
DEVTOOLS_PORT_NAME = "rigd.devtools"
DEVTOOLS_SOCKET = "devtools.sock"
RELAY_LOG = "/run/rigd-relay.log"
RELAY_PID_FILE = "/run/rigd-relay.pid"
#: The image's unprivileged user (images/browser/customize.sh).
BROWSER_USER = "browser"
#: The engine's pid and its stdout/stderr, in the guest's /run (tmpfs).
PID_FILE = "/run/rigd-browser.pid"
LOG_FILE = "/run/rigd-browser.log"
#: How often readiness asks DevTools (each ask is one exec: ~0.1-0.3 s under TCG).
POLL_S = 0.5
#: Where dropped files land for engines without a drop event (issue 12; Chromium gets a
#: real drop event later). In the guest: the rig's own /tmp, not the host's.
BROWSER_DROPS = DropTarget(dir="/tmp/cc-drops", owner=BROWSER_USER, told="none")  # noqa: S108
#: Chromium's: the same directory, and the page gets a real drop of the files (Input.dispatchDragEvent).
CHROMIUM_DROPS = DropTarget(dir="/tmp/cc-drops", owner=BROWSER_USER, told="drop-event")  # noqa: S108

START_PAGE = ('<!doctype html><html lang="en"><meta charset="utf-8"><title>rigd browser</title>'
              '<body><h1>rigd browser rig</h1><p>This page is a local document inside the rig.</p>'
              '</body></html>')

#: Chromium's own background services, off (issue 28, item 5): every lookup they make is a
#: refused DNS row in the rig's audit log, which must show what the page and the agent did.
#: Each feature named here phones home at rest in Chromium 1xx (optimization guides and their
#: models, translate, media-router discovery, autofill's server, the CT-log and network-time
#: queries, the field-trial seed); tests/integration/test_browser_rig.py bounds what is left.
CHROMIUM_QUIET_FEATURES = (
    "OptimizationHints",
    "OptimizationHintsFetching",
    "OptimizationGuideModelDownloading",
    "OptimizationTargetPrediction",
    "Translate",
    "MediaRouter",
    "DialMediaRouteProvider",
    "AutofillServerCommunication",
    "CertificateTransparencyComponentUpdater",
    "NetworkTimeServiceQuerying",
    "InterestFeedContentSuggestions",
    "PrivacySandboxSettings4",
    # Not network, but CPU at rest: the omnibox's WebUI popups (two renderers a headless engine
    # never shows), preloaded at start, kept a TCG guest's core busy ~25 s past "ready" (and the
    # engine's start ~10 s longer); measured in bench/open.py's idle line.
    "PreloadTopChromeWebUI",
    "WebUIOmniboxPopup",
    "WebUIOmniboxAimPopup",
)

#: The fresh profile's ``Default/Preferences`` (issue 28, item 5): what only a preference turns
#: off — the spell-check dictionary download (a text field fetches it from Google's CDN), the
#: DNS probe of google.com after a failed load, translate, safe-browsing and search suggestions,
#: network prediction (speculative lookups of links on the page).
CHROMIUM_PREFERENCES: dict[str, Any] = {
    "alternate_error_pages": {"enabled": False},
    "browser": {"enable_spellchecking": False},
    "spellcheck": {"dictionaries": [], "use_spelling_service": False},
    "translate": {"enabled": False},
    "safebrowsing": {"enabled": False},
    "search": {"suggest_enabled": False},
    "net": {"network_prediction_options": 2},
}

CHROMIUM_FLAGS = (
    "--headless=new",
    "--remote-debugging-address=127.0.0.1",
    "--no-first-run",
    "--no-default-browser-check",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-component-extensions-with-background-pages",
    "--disable-client-side-phishing-detection",
    "--disable-domain-reliability",
    "--disable-field-trial-config",
    "--safebrowsing-disable-auto-update",
    "--metrics-recording-only",
    "--no-pings",
    "--disable-sync",
    "--disable-default-apps",
    "--disable-breakpad",
    f"--disable-features={','.join(CHROMIUM_QUIET_FEATURES)}",
    # What has no off switch is pointed at a closed port on the guest's own loopback (refused
    # at once, no lookup, no row): Google accounts (the GAIA cookie check), Google APIs, the
    # component updater's and the variations seed's servers.
    *(f"--{switch}={QUIET_URL}" for switch in ("gaia-url", "google-apis-url", "lso-url",
                                                "variations-server-url")),
    f"--component-updater=url-source={QUIET_URL}",
    "--password-store=basic",
    "--window-size=1280,800",  # the browser's boot display (RIGS.md §7)
)


def loopback_relay_lines() -> list[str]:
    """Launch-script lines that start the guest-loopback relay :data:`RELAY_PORT` → the
    engine's :data:`GUEST_DEVTOOLS_PORT` beside the engine (it dials the engine only when a
    client connects), so readiness asks DevTools through it and only the port relay is left
    to start once the engine answers (:func:`relay_script`)."""
    return [
        f"setsid socat TCP-LISTEN:{RELAY_PORT},bind=127.0.0.1,reuseaddr,fork "
        f"TCP:127.0.0.1:{GUEST_DEVTOOLS_PORT} </dev/null >>{RELAY_LOG} 2>&1 &",
        f"echo $! >{RELAY_PID_FILE}",
    ]


def chromium_launch_script(*, port: int = GUEST_DEVTOOLS_PORT, sandbox: bool = True) -> str:
    """The shell script (run as root by the agent) that starts Chromium in the
    background as :data:`BROWSER_USER` with a fresh profile, and prints the profile dir.

    The engine gets a clean environment (its own HOME inside the profile) and
    no capabilities; its output goes to :data:`LOG_FILE` (never to the exec's
    pipes, so the exec returns as soon as the script does).
    """
    flags = [*CHROMIUM_FLAGS, f"--remote-debugging-port={port}"]
    if not sandbox:
        flags.append("--no-sandbox")
    u = shlex.quote(BROWSER_USER)
    return "\n".join([
        "set -eu",
        "p=$(mktemp -d /tmp/rigd-profile.XXXXXXXX)",
        f'chown {u}:{u} "$p"',
        'chmod 0700 "$p"',
        # The start page: a local document (RIGS.md §9: it needs no egress).
        f"printf '%s\\n' {shlex.quote(START_PAGE)} >\"$p/start.html\"",
        'mkdir "$p/Default"',
        f"printf '%s' {shlex.quote(json.dumps(CHROMIUM_PREFERENCES))} >\"$p/Default/Preferences\"",
        f'chown -R {u}:{u} "$p/start.html" "$p/Default"',
        f"setsid setpriv --reuid={u} --regid={u} --init-groups --inh-caps=-all --bounding-set=-all \\",
        '  env -i HOME="$p" PATH=/usr/bin:/bin LANG=C.UTF-8 \\',
        f'  /usr/bin/chromium {" ".join(flags)} --user-data-dir="$p" "file://$p/start.html" \\',
        f"  </dev/null >{LOG_FILE} 2>&1 &",
        f"echo $! >{PID_FILE}",
        *loopback_relay_lines(),
        'printf "%s\\n" "$p"',
    ])


#: Where a firefox-esr image keeps the startup cache its build compiled (images/browser/firefox_seed.py).
FIREFOX_SEED = "/usr/lib/rigd/firefox-seed"
#: Firefox's remote agent: WebDriver BiDi's WebSocket path.
BIDI_PATH = "/session"


def firefox_launch_script(*, port: int = GUEST_DEVTOOLS_PORT) -> str:
    """The shell script (run as root by the agent) that starts Firefox ESR in the background
    as :data:`BROWSER_USER` with a fresh profile (rigd's ``user.js``), its remote agent on
    guest loopback ``port`` accepting only the guest-side authority as ``Host``, and prints
    the profile's directory. As :func:`chromium_launch_script` otherwise."""
    u = shlex.quote(BROWSER_USER)
    return "\n".join([
        "set -eu",
        "p=$(mktemp -d /tmp/rigd-profile.XXXXXXXX)",
        'mkdir "$p/profile"',
        # The image's startup cache (images/browser/firefox_seed.py), if it has one: Firefox's
        # own code compiled at build time, nothing of another profile's.
        f"if [ -d {FIREFOX_SEED} ]; then cp -R {FIREFOX_SEED}/. \"$p/profile/\"; fi",
        f"printf '%s' {shlex.quote(user_js())} >\"$p/profile/user.js\"",
        f"printf '%s\\n' {shlex.quote(START_PAGE)} >\"$p/start.html\"",
        f'chown -R {u}:{u} "$p"',
        'chmod 0700 "$p"',
        f"setsid setpriv --reuid={u} --regid={u} --init-groups --inh-caps=-all --bounding-set=-all \\",
        # MOZ_REMOTE_SETTINGS_DEVTOOLS: a release build honours services.settings.server only with it.
        '  env -i HOME="$p" PATH=/usr/bin:/bin LANG=C.UTF-8 MOZ_CRASHREPORTER_DISABLE=1 \\',
        '  MOZ_REMOTE_SETTINGS_DEVTOOLS=1 \\',
        f"  /usr/bin/firefox-esr --headless --no-remote --new-instance --remote-debugging-port={port} \\",
        '  --remote-allow-hosts 127.0.0.1 --profile "$p/profile" "file://$p/start.html" \\',
        f"  </dev/null >{LOG_FILE} 2>&1 &",
        f"echo $! >{PID_FILE}",
        *loopback_relay_lines(),
        'printf "%s\\n" "$p"',
    ])


#: WebKit's X display in the guest (WebKitGTK has no headless mode): big enough for the largest
#: viewport (2560x1600) and MiniBrowser's own frame; nothing listens on TCP.
WEBKIT_DISPLAY = ":99"
WEBKIT_SCREEN = "2600x1700x24"
XVFB_LOG = "/run/rigd-xvfb.log"


def webkit_launch_script(*, port: int = GUEST_DEVTOOLS_PORT) -> str:
    """The shell script (run as root by the agent) that starts an X display (Xvfb, no TCP)
    and ``WebKitWebDriver --host 127.0.0.1`` on guest loopback ``port`` on it, both as
    :data:`BROWSER_USER` in a fresh home, and prints that directory. The driver starts
    MiniBrowser when rigd opens its session. As :func:`chromium_launch_script` otherwise;
    the engine's pid is the driver's (MiniBrowser is its child)."""
    u = shlex.quote(BROWSER_USER)
    as_user = (f"setsid setpriv --reuid={u} --regid={u} --init-groups --inh-caps=-all --bounding-set=-all "
               'env -i HOME="$p" PATH=/usr/bin:/bin LANG=C.UTF-8 XDG_RUNTIME_DIR="$p/run"')
    n = WEBKIT_DISPLAY.lstrip(":")
    return "\n".join([
        "set -eu",
        "p=$(mktemp -d /tmp/rigd-profile.XXXXXXXX)",
        'mkdir -m 0700 "$p/run"',
        'mkdir -p "$p/.config/gtk-3.0"',
        f"printf '%s' {shlex.quote(MINIBROWSER_GTK_CSS)} >\"$p/.config/gtk-3.0/gtk.css\"",
        f"printf '%s\\n' {shlex.quote(START_PAGE)} >\"$p/start.html\"",
        f'chown -R {u}:{u} "$p"',
        'chmod 0700 "$p"',
        "mkdir -p -m 1777 /tmp/.X11-unix",
        f"{as_user} /usr/bin/Xvfb {WEBKIT_DISPLAY} -screen 0 {WEBKIT_SCREEN} -nolisten tcp \\",
        f"  </dev/null >{XVFB_LOG} 2>&1 &",
        "x=$!",
        # The display accepts clients once its socket is there (a condition, bounded).
        "i=0",
        f'until [ -S /tmp/.X11-unix/X{n} ]; do',
        f'  kill -0 "$x" 2>/dev/null || {{ tail -c 1000 {XVFB_LOG} >&2; exit 3; }}',
        '  i=$((i+1)); [ "$i" -lt 600 ] || { echo "the X display never started" >&2; exit 4; }',
        "  sleep 0.05",
        "done",
        f"{as_user} DISPLAY={WEBKIT_DISPLAY} /usr/bin/WebKitWebDriver --host=127.0.0.1 --port={port} \\",
        f"  </dev/null >{LOG_FILE} 2>&1 &",
        f"echo $! >{PID_FILE}",
        *loopback_relay_lines(),
        'printf "%s\\n" "$p"',
    ])


def devtools_probe_script(port: int = RELAY_PORT, *, any_answer: bool = False) -> str:
    """Exit 0 with DevTools' ``/json/version`` on stdout (``any_answer``: once the port answers
    HTTP at all — Firefox's remote agent has no ``/json``); 1 when it does not answer
    yet; 3 (with the engine's log tail on stderr) when the engine is gone; 4 (with the relay's
    log) when the loopback relay the launch script started is gone. It asks through that
    relay, so an answer proves both."""
    ask = (f"curl -s -o /dev/null --max-time 3 http://127.0.0.1:{port}/" if any_answer
           else f"curl -sf --max-time 3 http://127.0.0.1:{port}/json/version")
    return "\n".join([
        f"{ask} && exit 0",
        f'pid=$(cat {PID_FILE} 2>/dev/null) || pid=""',
        'if [ -z "$pid" ] || ! kill -0 "$pid" 2>/dev/null; then',
        f"  tail -c 2000 {LOG_FILE} >&2; exit 3",
        "fi",
        f'relay=$(cat {RELAY_PID_FILE} 2>/dev/null) || relay=""',
        'if [ -z "$relay" ] || ! kill -0 "$relay" 2>/dev/null; then',
        f"  tail -c 1000 {RELAY_LOG} >&2; exit 4",
        "fi",
        "exit 1",
    ])


def relay_script(port_name: str = DEVTOOLS_PORT_NAME) -> str:
    """The shell script (run as root by the agent) that starts the port relay: the
    virtio-serial port ``port_name`` (the one host-side path in) → guest loopback
    :data:`RELAY_PORT`, where the launch script's relay (:func:`loopback_relay_lines`)
    reaches the engine's :data:`GUEST_DEVTOOLS_PORT`. Run once DevTools answers through
    that relay (:func:`devtools_probe_script`).

    Returns once the port relay holds the port open.
    """
    return "\n".join([
        "set -eu",
        'dev=""',
        "for d in /sys/class/virtio-ports/*; do",
        f'  if [ "$(cat "$d/name" 2>/dev/null)" = {shlex.quote(port_name)} ]; then dev="/dev/${{d##*/}}"; fi',
        "done",
        f'[ -n "$dev" ] || {{ echo "no virtio port named {port_name}" >&2; exit 2; }}',
        f'setsid socat GOPEN:"$dev" TCP:127.0.0.1:{RELAY_PORT} </dev/null >>{RELAY_LOG} 2>&1 &',
        "pid=$!",
        "i=0",
        # Return once the port relay holds the device (the host's bytes reach it from then on).
        'until ls -l "/proc/$pid/fd" 2>/dev/null | grep -q -- "-> $dev$"; do',
        '  kill -0 "$pid" 2>/dev/null || { echo "the port relay exited" >&2; exit 4; }',
        '  i=$((i+1)); [ "$i" -lt 100 ] || { echo "the port relay never opened $dev" >&2; exit 5; }',
        "  sleep 0.05",
        "done",
    ])


def engine_watch_script() -> str:
    """Return only when the engine's process is gone, with its log's tail on stderr."""
    return "\n".join([
        f'pid=$(cat {PID_FILE} 2>/dev/null) || pid=""',
        '[ -n "$pid" ] && tail --pid="$pid" -f /dev/null',
        f"tail -c 1500 {LOG_FILE} >&2",
    ])


__all__ = [
    "BIDI_PATH",
    "BROWSER_DROPS",
    "BROWSER_USER",
    "CHROMIUM_DROPS",
    "CHROMIUM_FLAGS",
    "DEVTOOLS_PORT_NAME",
    "DEVTOOLS_SOCKET",
    "GUEST_DEVTOOLS_PORT",
    "LOG_FILE",
    "PID_FILE",
    "POLL_S",
    "RELAY_LOG",
    "RELAY_PID_FILE",
    "RELAY_PORT",
    "START_PAGE",
    "WEBKIT_DISPLAY",
    "WEBKIT_SCREEN",
    "XVFB_LOG",
    "chromium_launch_script",
    "devtools_probe_script",
    "engine_watch_script",
    "firefox_launch_script",
    "loopback_relay_lines",
    "relay_script",
    "webkit_launch_script",
]
