"""Seed Firefox's startup cache into a firefox-esr browser image (run by customize.sh).

A rig's Firefox starts with a fresh, throwaway profile, so every start compiles all of
Firefox's own chrome JavaScript (the browser window, the remote agent's WebDriver BiDi
modules) from ``omni.ja``, most of a rig's first ``session.new`` under TCG. Firefox keeps
that work in the profile's ``startupCache/`` (bytecode of its own code, keyed by the build:
``compatibility.ini``). This script starts the image's Firefox once, natively, in the
image root (chroot, as the unprivileged ``browser`` user, a profile in the root's ``/tmp``),
drives one BiDi session (new session, the start page, a script, a capture; over the
builder's ``websockets``) so those modules are compiled, waits for the script preloader's
caches, closes Firefox (its exit writes the startup cache) and keeps the profile's
``startupCache/`` and ``compatibility.ini`` under ``FIREFOX_SEED``
(rigd.backends.browser_scripts); the launch script copies them into each fresh profile.

Nothing else of the profile is kept: its databases (``key4.db``'s key, places, cookies),
``prefs.js`` (client ids) and anything else a run draws at random stay each rig's own.

Usage: ``python firefox_seed.py ROOT`` (as root; the builder's interpreter, which can import
``rigd`` for the profile's ``user.js``). The engine's output is in ``ROOT/tmp/rigd-seed.log``
while it runs and is printed when the seeding fails.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from websockets.exceptions import ConnectionClosed
from websockets.sync.client import ClientConnection
from websockets.sync.client import connect as ws_connect

from rigd.backends.browser_scripts import FIREFOX_SEED as SEED_DIR
from rigd.browser.firefox import user_js

#: What of the seeding profile is kept.
KEPT = ("startupCache", "compatibility.ini")
#: The seeding run's home and profile: the image root's /tmp (removed afterwards), not the host's.
WORK = "/tmp/rigd-seed"  # noqa: S108
TIMEOUT_S = 120.0
#: What the script preloader writes once startup has gone idle (the seed waits for them).
PRELOADED = ("scriptCache.bin", "scriptCache-child.bin")
_IDS = itertools.count(1)


def call(ws: ClientConnection, method: str, params: dict[str, object]) -> dict[str, object]:
    """One BiDi command and its answer (events in between are skipped)."""
    ident = next(_IDS)
    ws.send(json.dumps({"id": ident, "method": method, "params": params}))
    while True:
        msg = json.loads(ws.recv(timeout=TIMEOUT_S))
        if msg.get("id") == ident:
            if msg.get("type") == "error":
                raise OSError(f"{method}: {msg.get('error')}: {msg.get('message')}")
            result = msg.get("result")
            return result if isinstance(result, dict) else {}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def connect(port: int, proc: subprocess.Popen[bytes]) -> ClientConnection:
    deadline = time.monotonic() + TIMEOUT_S
    while True:
        if proc.poll() is not None:
            raise OSError(f"Firefox exited ({proc.returncode}) before its remote agent answered")
        try:
            return ws_connect(f"ws://127.0.0.1:{port}/session", max_size=None, open_timeout=TIMEOUT_S)
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def wait_preloaded(cache: Path, proc: subprocess.Popen[bytes]) -> None:
    """Until the script preloader has written its caches (it does once startup is idle)."""
    deadline = time.monotonic() + TIMEOUT_S
    while not all((cache / name).exists() for name in PRELOADED):
        if proc.poll() is not None:
            raise OSError(f"Firefox exited ({proc.returncode}) before writing {', '.join(PRELOADED)}")
        if time.monotonic() > deadline:
            raise OSError(f"Firefox wrote no {', '.join(PRELOADED)} within {TIMEOUT_S:g} s")
        time.sleep(0.1)


def mounted(root: Path) -> list[Path]:
    """Mount what Firefox needs in the root (proc, dev, a tmpfs /dev/shm) if the build has not."""
    done: list[Path] = []
    for target, argv in (
        (root / "proc", ["mount", "-t", "proc", "proc"]),
        (root / "dev", ["mount", "--rbind", "/dev"]),
        (root / "dev" / "shm", ["mount", "-t", "tmpfs", "tmpfs"]),
    ):
        if os.path.ismount(target):
            continue
        target.mkdir(parents=True, exist_ok=True)
        subprocess.run([*argv, str(target)], check=True)
        done.append(target)
        if "--rbind" in argv:  # so that unmounting it never reaches the host's own /dev
            subprocess.run(["mount", "--make-rslave", str(target)], check=True)
    return done


def seed(root: Path) -> None:
    work = root / WORK.lstrip("/")
    shutil.rmtree(work, ignore_errors=True)
    profile = work / "profile"
    profile.mkdir(parents=True)
    (profile / "user.js").write_text(user_js())
    (work / "start.html").write_text("<!doctype html><title>rigd</title><p>seed</p>\n")
    subprocess.run(["chroot", str(root), "chown", "-R", "browser:browser", WORK], check=True)
    log = root / "tmp" / "rigd-seed.log"
    port = free_port()
    mounts = mounted(root)
    try:
        with open(log, "wb") as out:
            proc = subprocess.Popen(
                ["chroot", str(root), "setpriv", "--reuid=browser", "--regid=browser", "--init-groups",
                 "env", "-i", f"HOME={WORK}", "PATH=/usr/bin:/bin", "LANG=C.UTF-8",
                 "MOZ_CRASHREPORTER_DISABLE=1", "/usr/bin/firefox-esr", "--headless", "--no-remote",
                 "--new-instance", f"--remote-debugging-port={port}", "--remote-allow-hosts", "127.0.0.1",
                 "--profile", f"{WORK}/profile", f"file://{WORK}/start.html"],
                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT)
        try:
            with connect(port, proc) as ws:
                call(ws, "session.new", {"capabilities": {}})
                contexts = call(ws, "browsingContext.getTree", {}).get("contexts")
                assert isinstance(contexts, list) and contexts, "no browsing context"
                ctx = contexts[0]["context"]
                call(ws, "browsingContext.navigate", {"context": ctx, "url": f"file://{WORK}/start.html",
                                                      "wait": "complete"})
                call(ws, "script.evaluate", {"expression": "document.title", "target": {"context": ctx},
                                             "awaitPromise": False})
                call(ws, "browsingContext.captureScreenshot", {"context": ctx})
                wait_preloaded(profile / "startupCache", proc)
                # A clean exit writes the startup cache; the close may end the connection
                # before its answer comes.
                with contextlib.suppress(OSError, ConnectionClosed):
                    call(ws, "browser.close", {})
            proc.wait(timeout=TIMEOUT_S)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    except BaseException:
        sys.stderr.write(log.read_text(errors="replace")[-4000:])
        raise
    finally:
        for target in reversed(mounts):
            subprocess.run(["umount", "-l", str(target)], check=False)
    dest = root / SEED_DIR.lstrip("/")
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    for name in KEPT:
        src = profile / name
        if not src.exists():
            raise OSError(f"Firefox left no {name} in its profile")
        if src.is_dir():
            shutil.copytree(src, dest / name)
        else:
            shutil.copy2(src, dest / name)
    for path in [dest, *dest.rglob("*")]:
        os.chown(path, 0, 0)
        path.chmod(0o755 if path.is_dir() else 0o644)
    shutil.rmtree(work)
    log.unlink()
    size = sum(p.stat().st_size for p in dest.rglob("*") if p.is_file())
    print(f"firefox seed: {', '.join(KEPT)} ({size // 1024} KiB) in {SEED_DIR}")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: firefox_seed.py ROOT")
    seed(Path(sys.argv[1]))
