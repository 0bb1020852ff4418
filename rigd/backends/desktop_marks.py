"""Marks on a desktop (:mod:`rigd.marks`): the accessibility tree (AT-SPI) of the rig's X
session, read by a small Python program run in the guest as the session's user.

Why an exec and not a guest-agent op: AT-SPI is a D-Bus service of the *user's* session
(its own bus, found through the session bus), which the root agent cannot join; the
desktop's image already has ``python3-pyatspi`` and every exec as the desktop's user gets
that session's environment (:data:`rigd.verbs.terminal.SESSION_WRAP`). The program is
sent with each call (nothing to install, no image to rebuild), costs ~2 s under TCG for a
desktop with a terminal open (a walk of ~90 nodes, each a D-Bus round trip), and its output
is as hostile as the guest: :func:`rigd.marks.parse_marks` bounds it and :func:`parse_path`
checks each element's path.

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
import json, sys, time
req = json.loads(sys.argv[1])
try:
    import pyatspi
except Exception as exc:
    print(json.dumps({"error": "no AT-SPI client (python3-pyatspi) in this image: %s" % exc}))
    sys.exit(0)
ROLES = {"push button", "toggle button", "check box", "radio button", "menu", "menu item",
         "check menu item", "radio menu item", "combo box", "text", "entry", "password text",
         "spin button", "slider", "link", "page tab", "list item", "tree item", "table cell",
         "icon", "terminal", "toggle"}
deadline = time.monotonic() + req.get("seconds", 10)

def st_of(acc):
    return acc.getState()

def box_of(acc):
    e = acc.queryComponent().getExtents(pyatspi.DESKTOP_COORDS)
    return [e.x, e.y, e.width, e.height]

def disabled(st):
    return not (st.contains(pyatspi.STATE_SENSITIVE) and st.contains(pyatspi.STATE_ENABLED))

def showing(st):
    return st.contains(pyatspi.STATE_SHOWING) and st.contains(pyatspi.STATE_VISIBLE)

desktop = pyatspi.Registry.getDesktop(0)
if req["op"] == "target":
    acc = desktop
    try:
        for i in req["path"]:
            acc = acc.getChildAtIndex(i)
            if acc is None:
                break
        if acc is None or acc.getRoleName() != req["role"] or (acc.name or "") != req["name"]:
            print(json.dumps({"stale": "gone"}))
        else:
            st = st_of(acc)
            print(json.dumps({"box": box_of(acc), "showing": showing(st), "disabled": disabled(st)}))
    except Exception:
        print(json.dumps({"stale": "gone"}))
    sys.exit(0)

frames, items, nodes = [], [], [0]
truncated = [False]

def walk(acc, path, frame):
    if nodes[0] >= req["nodes"] or time.monotonic() > deadline:
        truncated[0] = True
        return
    nodes[0] += 1
    try:
        role, st = acc.getRoleName(), st_of(acc)
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
            st = st_of(win)
            if not showing(st):
                continue
            frames.append({"app": app_name, "role": win.getRoleName(), "box": box_of(win),
                           "active": st.contains(pyatspi.STATE_ACTIVE)})
        except Exception:
            continue
        walk(win, [a, w], len(frames) - 1)
print(json.dumps({"frames": frames, "items": items, "nodes": nodes[0], "truncated": truncated[0]}))
'''

#: Run a program in the guest as the desktop's user: (argv, timeout) -> (exit code, stdout).
Runner = Callable[[list[str], float], Awaitable[tuple[int | None, bytes]]]


def program_argv(user: str, request: dict[str, Any]) -> list[str]:
    """The exec that runs :data:`PROGRAM` as ``user`` in its X session."""
    return ["bash", "-c", SESSION_WRAP, "rigd-session", user, "--",
            "python3", "-I", "-c", PROGRAM, json.dumps(request)]


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


def parse_path(raw: object) -> list[int] | None:
    if isinstance(raw, list) and 0 < len(raw) <= PATH_MAX and all(
            isinstance(i, int) and not isinstance(i, bool) and 0 <= i < 100_000 for i in raw):
        return list(raw)
    return None


def _inside(frame_box: object, x: float, y: float) -> bool:
    if not (isinstance(frame_box, list) and len(frame_box) == 4
            and all(isinstance(v, int) and not isinstance(v, bool) for v in frame_box)):
        return False
    fx, fy, fw, fh = frame_box
    return bool(fx <= x < fx + fw and fy <= y < fy + fh)


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
        path, box, frame = parse_path(item.get("path")), item.get("box"), item.get("frame")
        if path is None or not (isinstance(box, list) and len(box) == 4 and all(
                isinstance(v, int) and not isinstance(v, bool) for v in box)):
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
    code, out = await run(program_argv(user, {"op": "marks", "nodes": NODES_MAX, "seconds": WALK_S}),
                          EXEC_TIMEOUT_S)
    return on_top(_answer(code, out), display)


async def target(run: Runner, user: str, path: list[int], role: str, name: str,
                 display: Display) -> tuple[tuple[int, int], bool] | str:
    """Where the widget at ``path`` is now (its centre on the display) and whether it is
    disabled, or why it is stale (it is gone, another widget is there, it is hidden)."""
    code, out = await run(program_argv(user, {"op": "target", "path": path, "role": role, "name": name}),
                          EXEC_TIMEOUT_S)
    doc = _answer(code, out)
    if isinstance(doc.get("stale"), str):
        return "its widget is gone (its window closed or changed)"
    box = doc.get("box")
    if not (isinstance(box, list) and len(box) == 4 and all(
            isinstance(v, int) and not isinstance(v, bool) for v in box)) or doc.get("showing") is not True:
        return "its widget is no longer shown"
    x0, y0 = max(0, box[0]), max(0, box[1])
    x1, y1 = min(display.width, box[0] + box[2]), min(display.height, box[1] + box[3])
    if x1 - x0 < 1 or y1 - y0 < 1:
        return "its widget is no longer on the display"
    return ((x0 + x1) // 2, (y0 + y1) // 2), doc.get("disabled") is True


__all__ = ["PROGRAM", "Runner", "find", "on_top", "parse_path", "program_argv", "target"]
