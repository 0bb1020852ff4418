"""Test and benchmark fixtures for the browser: pages on host loopback, and the host's own
Chromium (the "same engine on the host, same client" peer). Nothing here is used by the server.

* :func:`serve_pages`: a threaded HTTP server on ``127.0.0.1`` answering each GET with what a
  ``respond(path)`` callable says (``None``: 404).
* :func:`start_host_chromium` / :func:`stop_host_chromium`: ``chromium --headless=new`` with its
  own profile and DevTools on an ephemeral loopback port (read from ``DevToolsActivePort``),
  in its own process group, which stopping kills (SIGTERM, then SIGKILL) by the leader's pid.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import ssl
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import IO, Any

from rigd.protocols.cdp import parse_active_port

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"

#: ``respond(path)`` → (status, HTML) or None for a 404. ``path`` keeps its query string.
Respond = Callable[[str], "tuple[int, str] | None"]


@contextlib.contextmanager
def serve_pages(respond: Respond, *, tls: ssl.SSLContext | None = None) -> Iterator[str]:
    """Serve ``respond``'s pages on host loopback for the block (over TLS with a server
    context); yields the base URL."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            answer = respond(self.path)
            status, body = answer if answer is not None else (404, "not found")
            data = body.encode()
            self.send_response(status)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Content-Length", str(len(data)))
            self.send_header("Cache-Control", "no-store")
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    if tls is not None:
        server.socket = tls.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"{'https' if tls else 'http'}://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def static_pages(pages: dict[str, str]) -> Respond:
    """A ``respond`` for fixed pages (the query string is ignored)."""
    def respond(path: str) -> tuple[int, str] | None:
        body = pages.get(path.split("?", 1)[0])
        return None if body is None else (200, body)
    return respond


@dataclass
class HostChromium:
    ws_url: str
    proc: subprocess.Popen[bytes]
    log: IO[bytes]


def start_host_chromium(home: Path, *extra: str, timeout_s: float = 60) -> HostChromium:
    """Start the host's Chromium headless (profile and log in ``home``); blocking until its
    DevTools port is known. Stop it with :func:`stop_host_chromium`, also on errors."""
    profile = home / "profile"
    log = (home / "chromium.log").open("wb")
    proc = subprocess.Popen(
        [CHROMIUM, "--headless=new", "--no-sandbox", "--remote-debugging-port=0",
         f"--user-data-dir={profile}", "--no-first-run", "--no-default-browser-check",
         "--disable-gpu", "--disable-extensions", "--disable-background-networking",
         "--disable-sync", "--disable-component-update", "--mute-audio", "--window-size=1280,800",
         *extra, "about:blank"],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=log, start_new_session=True,
    )
    host = HostChromium("", proc, log)
    try:
        port_file = profile / "DevToolsActivePort"
        deadline = time.monotonic() + timeout_s
        while True:
            with contextlib.suppress(FileNotFoundError):
                text = port_file.read_text()
                if len(text.splitlines()) >= 2:
                    break
            if proc.poll() is not None or time.monotonic() > deadline:
                log.flush()
                raise RuntimeError("chromium did not write DevToolsActivePort: "
                                   + (home / "chromium.log").read_text(errors="replace")[-2000:])
            time.sleep(0.05)
        host.ws_url = parse_active_port(text).ws_url()
        return host
    except BaseException:
        stop_host_chromium(host)
        raise


FIREFOX = shutil.which("firefox-esr") or "/usr/bin/firefox-esr"
_BIDI_LISTENING = re.compile(rb"WebDriver BiDi listening on ws://127\.0\.0\.1:(\d{1,5})")


def start_host_firefox(home: Path, timeout_s: float = 60) -> HostChromium:
    """Start the host's Firefox ESR headless with its remote agent (WebDriver BiDi) on a free
    loopback port, the rig's preferences in a fresh profile under ``home``; blocking until it
    listens. ``ws_url`` is its ``/session`` endpoint. Stop it with :func:`stop_host_chromium`."""
    from rigd.browser.firefox import user_js

    profile = home / "profile"
    profile.mkdir(parents=True, exist_ok=True)
    (profile / "user.js").write_text(user_js())
    log_path = home / "firefox.log"
    log = log_path.open("wb")
    proc = subprocess.Popen(
        [FIREFOX, "--headless", "--no-remote", "--new-instance", "--remote-debugging-port=0",
         "--profile", str(profile), "about:blank"],
        stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        env={"HOME": str(home), "PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "MOZ_CRASHREPORTER_DISABLE": "1"},
    )
    host = HostChromium("", proc, log)
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            found = _BIDI_LISTENING.search(log_path.read_bytes())
            if found:
                break
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("firefox's remote agent did not listen: "
                                   + log_path.read_text(errors="replace")[-2000:])
            time.sleep(0.05)
        host.ws_url = f"ws://127.0.0.1:{int(found.group(1))}/session"
        return host
    except BaseException:
        stop_host_chromium(host)
        raise


WEBKIT_DRIVER = shutil.which("WebKitWebDriver") or "/usr/bin/WebKitWebDriver"
XVFB = shutil.which("Xvfb") or "/usr/bin/Xvfb"
#: The host tests' X screen: big enough for the largest viewport and MiniBrowser's frame.
XVFB_SCREEN = "2600x1700x24"


def start_host_webkit(home: Path, timeout_s: float = 60) -> HostChromium:
    """Start an Xvfb display and WebKitWebDriver on it (a free loopback port), in one process
    group; blocking until the driver listens. ``ws_url`` is its ``http://`` base (the driver
    starts MiniBrowser per session). Stop it with :func:`stop_host_chromium`."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    from rigd.browser.webkit import MINIBROWSER_GTK_CSS

    (home / ".config" / "gtk-3.0").mkdir(parents=True, exist_ok=True)
    (home / ".config" / "gtk-3.0" / "gtk.css").write_text(MINIBROWSER_GTK_CSS)  # as a rig's
    log = (home / "webkit.log").open("wb")
    display_file = home / "display"
    display_file.unlink(missing_ok=True)
    script = "\n".join([
        "set -eu",
        f'{XVFB} -displayfd 1 -screen 0 {XVFB_SCREEN} -nolisten tcp >"$1" &',
        # Xvfb writes the display's number once it accepts clients.
        'until grep -qx "[0-9][0-9]*" "$1" 2>/dev/null; do kill -0 $! || exit 3; sleep 0.05; done',
        'export DISPLAY=":$(cat "$1")"',
        f"exec {WEBKIT_DRIVER} --host=127.0.0.1 --port={port}",
    ])
    proc = subprocess.Popen(
        ["/bin/sh", "-c", script, "sh", str(display_file)], stdin=subprocess.DEVNULL, stdout=log,
        stderr=subprocess.STDOUT, start_new_session=True,
        env={"HOME": str(home), "PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"},
    )
    host = HostChromium(f"http://127.0.0.1:{port}", proc, log)
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
                return host
            if proc.poll() is not None or time.monotonic() > deadline:
                log.flush()
                raise RuntimeError("WebKitWebDriver did not listen: "
                                   + (home / "webkit.log").read_text(errors="replace")[-2000:])
            time.sleep(0.05)
    except BaseException:
        stop_host_chromium(host)
        raise


def stop_host_chromium(host: HostChromium) -> None:
    """Kill Chromium's process group (its zygote, renderers and GPU process share it)."""
    proc = host.proc
    for sig, wait in ((signal.SIGTERM, 10), (signal.SIGKILL, 10)):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        try:
            proc.wait(wait)
            break
        except subprocess.TimeoutExpired:
            continue
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    host.log.close()


__all__ = [
    "CHROMIUM",
    "FIREFOX",
    "HostChromium",
    "Respond",
    "serve_pages",
    "start_host_chromium",
    "start_host_firefox",
    "start_host_webkit",
    "static_pages",
    "stop_host_chromium",
]
