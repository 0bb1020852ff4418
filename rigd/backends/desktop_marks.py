"""Marks on a desktop (:mod:`rigd.marks`): the accessibility tree (AT-SPI) of the rig's X
session, read by a small Python program run in the guest as the session's user.

Why an exec and not a guest-agent op: AT-SPI is a D-Bus service of the *user's* session
(its own bus, found through the session bus), which the root agent cannot join; the
desktop's image already has ``python3-pyatspi`` and every exec as the desktop's user gets
that session's environment (:data:`rigd.verbs.terminal.SESSION_WRAP`). The program is
sent from here (nothing to install, no image to rebuild): the first call starts it as a
helper kept running as the session's user on a socket in that user's runtime directory,
and each call after is one request line through ``socat`` (0.61 s a marked still under
TCG, against 1.87 s for a program run per call: :func:`ask`). Its output is as hostile as
the guest: :func:`rigd.marks.parse_marks` bounds it and :func:`parse_path` checks each
element's path.

What is marked: widgets a person acts on (buttons, toggles, checks, radios, menus and their
items, text fields, combo boxes, sliders, spin buttons, links, tabs, list and tree items,
icons, terminals) that are showing, visible and on the display. What covers what is
approximated from AT-SPI (which has no stacking order): popups (an open menu) are above
all, then the panel, the active window above the other windows, the desktop below them all;
a widget whose centre a higher window covers is left out. A disabled widget (not sensitive or not
enabled) is marked with ``disabled`` and waited for when acted on.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

import trio

from rigd.errors import Conflict
from rigd.model import Display
from rigd.verbs.terminal import SESSION_WRAP

#: How much of the tree one call walks, and for how long, before it answers what it has.
NODES_MAX = 2500
WALK_S = 10.0
EXEC_TIMEOUT_S = 30.0
OUTPUT_MAX = 1 << 20
PATH_MAX = 64

PROGRAM = r'''
import json, os, socket, sys, time
try:
    import pyatspi
except Exception as exc:
    pyatspi = None
    MISSING = "no AT-SPI client (python3-pyatspi) in this image: %s" % exc
ROLES = {"push button", "toggle button", "check box", "radio button", "menu", "menu item",
         "check menu item", "radio menu item", "combo box", "text", "entry", "password text",
         "spin button", "slider", "link", "page tab", "list item", "tree item", "table cell",
         "icon", "terminal", "toggle"}

def box_of(acc):
    e = acc.queryComponent().getExtents(pyatspi.DESKTOP_COORDS)
    return [e.x, e.y, e.width, e.height]

def disabled(st):
    return not (st.contains(pyatspi.STATE_SENSITIVE) and st.contains(pyatspi.STATE_ENABLED))

def showing(st):
    return st.contains(pyatspi.STATE_SHOWING) and st.contains(pyatspi.STATE_VISIBLE)

def target(desktop, req):
    acc = desktop
    try:
        for i in req["path"]:
            acc = acc.getChildAtIndex(i)
            if acc is None:
                return {"stale": "gone"}
        if acc.getRoleName() != req["role"] or (acc.name or "") != req["name"]:
            return {"stale": "gone"}
        st = acc.getState()
        return {"box": box_of(acc), "showing": showing(st), "disabled": disabled(st)}
    except Exception:
        return {"stale": "gone"}

def marks(desktop, req):
    deadline = time.monotonic() + req.get("seconds", 10)
    frames, items, nodes, cut = [], [], [0], [False]

    def walk(acc, path, frame):
        if nodes[0] >= req["nodes"] or time.monotonic() > deadline:
            cut[0] = True
            return
        nodes[0] += 1
        try:
            role, st = acc.getRoleName(), acc.getState()
            if not showing(st):
                return
            if role in ROLES:
                items.append({"role": role, "name": acc.name or "", "box": box_of(acc),
                              "disabled": disabled(st), "path": path, "frame": frame})
            if role == "terminal":
                return
            count = min(acc.childCount, 1000)
        except Exception:
            return
        for i in range(count):
            try:
                child = acc.getChildAtIndex(i)
            except Exception:
                continue
            if child is not None:
                walk(child, path + [i], frame)

    for a in range(min(desktop.childCount, 200)):
        try:
            app = desktop.getChildAtIndex(a)
            app_name = app.name or ""
            windows = min(app.childCount, 100)
        except Exception:
            continue
        for w in range(windows):
            try:
                win = app.getChildAtIndex(w)
                if win is None:
                    continue
                st = win.getState()
                if not showing(st):
                    continue
                frames.append({"app": app_name, "role": win.getRoleName(), "box": box_of(win),
                               "active": st.contains(pyatspi.STATE_ACTIVE)})
            except Exception:
                continue
            walk(win, [a, w], len(frames) - 1)
    return {"frames": frames, "items": items, "nodes": nodes[0], "truncated": cut[0]}

def answer(req):
    if pyatspi is None:
        return {"error": MISSING}
    desktop = pyatspi.Registry.getDesktop(0)
    return target(desktop, req) if req.get("op") == "target" else marks(desktop, req)

if sys.argv[1] == "serve":
    # Kept running as the session's user (one pyatspi import, one bus connection), one request
    # per connection on a socket only its user (and root) can reach.
    path = sys.argv[2]
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    old = os.umask(0o077)
    srv = socket.socket(socket.AF_UNIX)
    srv.bind(path)
    os.umask(old)
    srv.listen(4)
    while True:
        conn, _ = srv.accept()
        with conn:
            conn.settimeout(30)
            try:
                data = b""
                while not data.endswith(b"\n") and len(data) < 65536:
                    chunk = conn.recv(65536)
                    if not chunk:
                        break
                    data += chunk
                out = answer(json.loads(data))
            except Exception as exc:
                out = {"error": "the marks helper failed: %s" % type(exc).__name__}
            try:
                conn.sendall(json.dumps(out).encode() + b"\n")
            except OSError:
                pass
else:
    print(json.dumps(answer(json.loads(sys.argv[1]))))
'''

#: Run a program in the guest: (argv, timeout, stdin) -> (exit code, stdout).
Runner = Callable[[list[str], float, bytes | None], Awaitable[tuple[int | None, bytes]]]
#: The helper's socket, in the session user's runtime directory (mode 0700, theirs).
SOCKET = "rigd-marks.sock"
#: How long a helper just started may take to listen (python3 and pyatspi under TCG).
HELPER_START_S = 15.0


def program_argv(user: str, request: dict[str, Any]) -> list[str]:
    """The exec that runs :data:`PROGRAM` once as ``user`` in its X session."""
    return ["bash", "-c", SESSION_WRAP, "rigd-session", user, "--",
            "python3", "-I", "-c", PROGRAM, json.dumps(request)]


def helper_argv(user: str) -> list[str]:
    """The exec that starts :data:`PROGRAM` as ``user``'s helper (detached, kept running)."""
    return ["bash", "-c", SESSION_WRAP, "rigd-session", user, "--", "sh", "-c",
            'exec setsid -f python3 -I -c "$0" serve "${XDG_RUNTIME_DIR:-/run/user/$(id -u)}/' + SOCKET
            + '" </dev/null >/dev/null 2>&1', PROGRAM]


def client_argv(user: str) -> list[str]:
    """The exec (as root) that asks ``user``'s helper one request (stdin) for its answer."""
    return ["/bin/sh", "-c", f'exec socat -t 30 - "UNIX-CONNECT:/run/user/$(id -u {user})/{SOCKET}"']


async def ask(run: Runner, user: str, request: dict[str, Any]) -> dict[str, Any]:
    """``request``'s answer from the session user's helper, started on first use; the
    program run once when there is no helper to be had (no socat, a helper that fails)."""
    line = json.dumps(request).encode() + b"\n"
    code, out = await run(client_argv(user), EXEC_TIMEOUT_S, line)
    if code not in (0, 127) or (code == 0 and not out.strip()):  # 127: no socat, no helper to ask
        await run(helper_argv(user), EXEC_TIMEOUT_S, None)
        with trio.move_on_after(HELPER_START_S):
            while True:
                code, out = await run(client_argv(user), EXEC_TIMEOUT_S, line)
                if code == 0 and out.strip():
                    break
                await trio.sleep(0.25)
    if code == 0 and out.strip():
        try:
            return _answer(code, out)
        except Conflict:
            if b"python3-pyatspi" in out:  # the image has no AT-SPI client: one run says the same
                raise
    code, out = await run(program_argv(user, request), EXEC_TIMEOUT_S, None)
    return _answer(code, out)


def _answer(code: int | None, stdout: bytes) -> dict[str, Any]:
    lines = stdout.decode("utf-8", "replace").strip().splitlines()
    try:
        doc = json.loads(lines[-1]) if lines else None
    except ValueError:
        doc = None
    if code != 0 or not isinstance(doc, dict):
        raise Conflict("screenshot marks: the desktop's accessibility tree could not be read "
                       f"(exit {code}: {stdout[-200:].decode('utf-8', 'replace')!r})",
                       reason="no accessibility tree", field="action.marks")
    if isinstance(doc.get("error"), str):
        raise Conflict(f"screenshot marks: {doc['error'][:300]}", reason="no accessibility tree",
                       field="action.marks")
    return doc


#: A widget's name and role longer than these leave it unmarked: the guest's words are
#: compared as given when the widget is found again, so they are never cut.
NAME_MAX = 1000
ROLE_MAX = 64


def _int_box(raw: object) -> tuple[int, int, int, int] | None:
    """``[x, y, w, h]`` of four integers, as the guest's program sends extents."""
    if isinstance(raw, list) and len(raw) == 4 and all(
            isinstance(v, int) and not isinstance(v, bool) for v in raw):
        return raw[0], raw[1], raw[2], raw[3]
    return None


def parse_path(raw: object) -> list[int] | None:
    if isinstance(raw, list) and 0 < len(raw) <= PATH_MAX and all(
            isinstance(i, int) and not isinstance(i, bool) and 0 <= i < 100_000 for i in raw):
        return list(raw)
    return None


def _inside(frame_box: object, x: float, y: float) -> bool:
    box = _int_box(frame_box)
    if box is None:
        return False
    fx, fy, fw, fh = box
    return fx <= x < fx + fw and fy <= y < fy + fh


def _layer(frame: object) -> float:
    """Where a window stands: popups (an open menu, a tooltip: role ``window``) above all, then
    the panel, the active window above the others, the desktop (its icons) below them all."""
    if not isinstance(frame, dict):
        return 1.0
    if frame.get("role") == "window":
        return 4.0
    if frame.get("app") == "xfce4-panel":
        return 3.0
    if frame.get("app") == "xfdesktop":
        return 0.0
    return 2.0 if frame.get("active") is True else 1.0


def on_top(doc: dict[str, Any], display: Display) -> tuple[list[dict[str, Any]], int, bool]:
    """The items of a walk that are on the display and not under a higher window, with
    their paths checked; how many were dropped as covered; whether the walk was cut short."""
    raw_frames, raw_items = doc.get("frames"), doc.get("items")
    frames: list[Any] = raw_frames if isinstance(raw_frames, list) else []
    items: list[Any] = raw_items if isinstance(raw_items, list) else []
    kept: list[dict[str, Any]] = []
    covered = 0
    for item in items[:NODES_MAX]:
        if not isinstance(item, dict):
            continue
        path, box, frame = parse_path(item.get("path")), _int_box(item.get("box")), item.get("frame")
        name, role = item.get("name"), item.get("role")
        if path is None or box is None or not (isinstance(name, str) and len(name) <= NAME_MAX
                                               and isinstance(role, str) and len(role) <= ROLE_MAX):
            continue
        x, y = box[0] + box[2] / 2, box[1] + box[3] / 2
        if not (0 <= x < display.width and 0 <= y < display.height):
            continue
        own = frames[frame] if isinstance(frame, int) and 0 <= frame < len(frames) else None
        mine = _layer(own)
        if any(f is not own and _layer(f) > mine and _inside(f.get("box"), x, y)
               for f in frames if isinstance(f, dict)):
            covered += 1
            continue
        kept.append({**item, "path": path})
    return kept, covered, doc.get("truncated") is True


async def find(run: Runner, user: str, display: Display) -> tuple[list[dict[str, Any]], int, bool]:
    """The desktop's markable widgets (see the module), in the tree's order."""
    return on_top(await ask(run, user, {"op": "marks", "nodes": NODES_MAX, "seconds": WALK_S}), display)


async def target(run: Runner, user: str, path: list[int], role: str, name: str,
                 display: Display) -> tuple[tuple[int, int], bool] | str:
    """Where the widget at ``path`` is now (its centre on the display) and whether it is
    disabled, or why it is stale (it is gone, another widget is there, it is hidden)."""
    doc = await ask(run, user, {"op": "target", "path": path, "role": role, "name": name})
    if isinstance(doc.get("stale"), str):
        return "its widget is gone (its window closed or changed)"
    box = _int_box(doc.get("box"))
    if box is None or doc.get("showing") is not True:
        return "its widget is no longer shown"
    x0, y0 = max(0, box[0]), max(0, box[1])
    x1, y1 = min(display.width, box[0] + box[2]), min(display.height, box[1] + box[3])
    if x1 - x0 < 1 or y1 - y0 < 1:
        return "its widget is no longer on the display"
    return ((x0 + x1) // 2, (y0 + y1) // 2), doc.get("disabled") is True


__all__ = ["PROGRAM", "Runner", "ask", "client_argv", "find", "helper_argv", "on_top", "parse_path",
           "program_argv", "target"]
