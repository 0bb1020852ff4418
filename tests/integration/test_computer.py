"""A real computer rig under TCG, driven through ``rig.act computer_use`` and the live view.

One desktop rig for the module, on the run's shared desktop server (tests
conftest ``desktop_server``: a warm start from the snapshot it keeps between
runs); the tests run in file order and leave the rig in a known state for
the next, and a test that leaves it unhealthy gets it replaced, saying so.
Input goes through QMP; what arrived is read back through the guest agent
(``terminal_use exec``) — files the typed commands wrote, exit codes of the
clicked program, selections.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import os
import re
import shutil
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio
from mcp import Client
from PIL import Image
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect

from rigd.images.desktop import find_desktop
from rigd.tools.mcp import CONVERSATION_HEADER, WORKSPACE_HEADER
from tests.integration.conftest import (
    DESKTOP_SHAPE,
    Server,
    SharedRig,
    make_data_dir,
    mark_drawn,
    remove_tree,
)
from tests.integration.conftest import decoded as rgb
from tests.integration.mcp_clients import http_mcp, images_of, stdio_mcp, text_of
from tests.integration.scripted_model import run_agent, scripted_endpoint, tool_call

pytestmark = [
    pytest.mark.vm,
    pytest.mark.timeout(900),
    pytest.mark.skipif(shutil.which("qemu-system-x86_64") is None, reason="needs QEMU"),
]

#: The session of the desktop's user, for programs the tests start in the guest.
SESSION = "DISPLAY=:0 XAUTHORITY=/home/rig/.Xauthority HOME=/home/rig"
AS_RIG = f"runuser -u rig -- env {SESSION} DBUS_SESSION_BUS_ADDRESS=unix:path=/run/user/1000/bus"


@pytest.fixture(scope="module")
def desk_rig(desktop_server: Server) -> Iterator[SharedRig]:
    shared = SharedRig(desktop_server, {"workspace": "default", "surface": "computer", **DESKTOP_SHAPE})
    shared.open()
    try:
        yield shared
    finally:
        shared.close()


@pytest.fixture
def desk(desk_rig: SharedRig, request: pytest.FixtureRequest) -> tuple[Server, str]:
    return desk_rig.srv, desk_rig.healthy(request.node.nodeid)


def act(srv: Server, rig: str, token: str | None = None, **action: Any) -> dict[str, Any]:
    return dict(srv.call("rig.act", {"rigId": rig, "tool": "computer_use", "action": action}, token=token))


def sh(srv: Server, rig: str, command: str, timeout_s: float = 60) -> str:
    out = srv.call("rig.act", {"rigId": rig, "tool": "terminal_use",
                               "action": {"action": "exec", "command": command, "timeoutS": timeout_s,
                                          "user": "root"}})
    assert out["exitCode"] == 0, out
    return str(out["stdout"]["text"])


def wait_for(srv: Server, rig: str, command: str, deadline_s: float = 120) -> str:
    """Run ``command`` in the guest until it succeeds; return its output."""
    end = time.monotonic() + deadline_s
    while True:
        out = srv.call("rig.act", {"rigId": rig, "tool": "terminal_use",
                                   "action": {"action": "exec", "command": command, "timeoutS": 30,
                                              "user": "root"}})
        if out["exitCode"] == 0:
            return str(out["stdout"]["text"])
        assert time.monotonic() < end, f"{command!r} never succeeded: {out}"
        time.sleep(1)


def active_window(srv: Server, rig: str, name_re: str) -> None:
    wait_for(srv, rig, f"{SESSION} xdotool getactivewindow getwindowname | grep -E {name_re!r}")


#: The newest terminal's shell: xfce4-terminal shows (and focuses) its window before it has spawned
#: the shell on its pty, and keys it gets before then can be lost (a typed command never ran
#: on a loaded host, its window active).
TERMINAL_SHELL = "pgrep -u rig -n -x bash -P \"$(pgrep -d, -u rig -x xfce4-terminal)\""


def terminal_ready(srv: Server, rig: str) -> None:
    """A terminal window is the active one and its shell runs (typed keys reach the shell)."""
    active_window(srv, rig, "^Terminal")
    wait_for(srv, rig, TERMINAL_SHELL)


def test_rig_is_a_desktop_not_a_terminal(desk: tuple[Server, str]) -> None:
    srv, rig = desk
    got = srv.call("rig.get", {"rigId": rig})
    assert got["surface"] == "computer"
    assert got["backend"] == "qemu-tcg" and got["accel"] == "tcg"
    assert got["display"] == {"width": 1280, "height": 800}
    assert got["execImage"] is False
    assert got["image"].startswith("sha256:")
    # A conversation's terminal is never this rig.
    listed = srv.call("rig.list", {"workspace": "default"})
    assert [r["surface"] for r in listed] == ["computer"]


def test_exec_runs_as_the_desktop_user_in_its_session_unless_root_is_asked(desk: tuple[Server, str]) -> None:
    srv, rig = desk

    def run(**action: Any) -> dict[str, Any]:
        return dict(srv.call("rig.act", {"rigId": rig, "tool": "terminal_use",
                                         "action": {"action": "exec", "timeoutS": 60, **action}}))

    out = run(command='printf "%s %s %s " "$(id -un)" "$DISPLAY" "$PWD"; xdotool getdisplaygeometry',
              env={"GREETING": "hi"})
    assert out["exitCode"] == 0, out
    who, display, cwd, *geometry = out["stdout"]["text"].split()
    assert (who, display, cwd) == ("rig", ":0", "/home/rig") and len(geometry) == 2, out
    assert run(argv=["sh", "-c", "echo $GREETING"], env={"GREETING": "hi"})["stdout"]["text"] == "hi\n"
    assert run(argv=["id", "-un"], user="root")["stdout"]["text"] == "root\n"
    err = srv.error("rig.act", {"rigId": rig, "tool": "terminal_use",
                                "action": {"action": "exec", "argv": ["id"], "user": "mallory"}})
    assert err["data"]["field"] == "action.user", err
    # The agent's tool reaches its own desktop by rigId, as the desktop's user.
    tool = srv.call("tools.call", {"workspace": "default", "conversation": "c1", "name": "terminal_use",
                                   "arguments": {"action": "exec", "argv": ["id", "-un"], "rigId": rig}})
    assert tool["isError"] is False and "rig" in tool["content"][0]["text"], tool


def test_the_desktop_reaches_out_only_through_its_gateway(desk: tuple[Server, str]) -> None:
    srv, rig = desk
    network = srv.call("rig.get", {"rigId": rig})["network"]
    assert network["mode"] in ("gateway", "user")
    # A direct IP is refused by the rig's own gateway (names only), whatever is out there.
    out = sh(srv, rig, "curl -s -m 20 -o - -w ' %{http_code}' http://192.0.2.10/ || true")
    assert out.endswith(" 403") and "rigd egress gateway" in out, out
    assert "nameserver" in sh(srv, rig, "cat /etc/resolv.conf")


def test_screenshot_is_a_jpeg_of_the_stated_size(desk: tuple[Server, str]) -> None:
    srv, rig = desk
    shot = act(srv, rig, action="screenshot")
    # From the lane measured fastest on this machine (the live view's), and it says so.
    assert shot["source"] == shot["lane"]["source"] in ("agent", "qmp")
    assert shot["lane"]["why"].startswith("measured: ") and shot["cursorMarked"] is True
    assert shot["image"]["mediaType"] == "image/jpeg"
    assert shot["display"] == {"width": 1280, "height": 800}
    assert shot["imageSize"] == {"width": 1280, "height": 800} and shot["scale"] == 1.0
    with Image.open(io.BytesIO(base64.b64decode(shot["image"]["data"]))) as img:
        assert img.format == "JPEG"
        assert img.size == (1280, 800)
        colours = img.convert("RGB").getcolors(1 << 20)
        assert colours is not None and len(colours) > 64  # the XFCE desktop, not a blank


def test_cursor_position_follows_mouse_move(desk: tuple[Server, str]) -> None:
    srv, rig = desk
    for point in ([400, 300], [0, 0], [1279, 799]):
        act(srv, rig, action="mouse_move", coordinate=point)
        assert act(srv, rig, action="cursor_position")["coordinate"] == point


def test_out_of_range_coordinates_are_a_field_error(desk: tuple[Server, str]) -> None:
    srv, rig = desk
    err = srv.error("rig.act", {"rigId": rig, "tool": "computer_use",
                                "action": {"action": "left_click", "coordinate": [1280, 10]}})
    assert err["data"]["field"] == "action.coordinate"
    assert "1280x800" in err["data"]["reason"]


def test_typing_into_a_terminal_window_runs_the_command(desk: tuple[Server, str]) -> None:
    srv, rig = desk
    sh(srv, rig, f"{AS_RIG} setsid -f xfce4-terminal --disable-server --geometry 80x24+100+100 "
                 ">/dev/null 2>&1")
    terminal_ready(srv, rig)
    typed = act(srv, rig, action="type", text="echo rig-$((6*7)) > ~/out.txt")
    assert typed == {"characters": 29, "dropped": 0, "via": "keys"}
    act(srv, rig, action="key", text="Return")
    assert wait_for(srv, rig, "cat /home/rig/out.txt").strip() == "rig-42"


def test_unicode_reaches_the_terminal_intact(desk: tuple[Server, str]) -> None:
    srv, rig = desk
    act(srv, rig, action="type", text="cat > ~/uni.txt\n")
    typed = act(srv, rig, action="type", text="héllo wörld 世界")
    assert typed["dropped"] == 0 and typed["via"] == "keys+keymap"
    act(srv, rig, action="key", text="Return ctrl+d")
    got = wait_for(srv, rig, "test -s /home/rig/uni.txt && cat /home/rig/uni.txt")
    assert got == "héllo wörld 世界\n"


def test_typing_never_touches_the_clipboard_and_newline_is_enter(desk: tuple[Server, str]) -> None:
    """A `\n` inside typed text is Return (the command runs); what was copied stays copied."""
    srv, rig = desk
    act(srv, rig, action="clipboard_write", text="copied by a person")
    sh(srv, rig, "rm -f /home/rig/t.txt")
    terminal_ready(srv, rig)
    typed = act(srv, rig, action="type", text="echo héllo wörld > ~/t.txt\n")
    assert typed["via"] == "keys+keymap"
    assert wait_for(srv, rig, "test -s /home/rig/t.txt && cat /home/rig/t.txt") == "héllo wörld\n"
    assert act(srv, rig, action="clipboard_read")["content"]["text"] == "copied by a person"


def test_marks_number_the_desktops_widgets_on_the_agents_still_only(desk: tuple[Server, str]) -> None:
    """Issue 30: a marked still of the desktop (its AT-SPI tree): the panel's and the terminal's
    widgets; a click by mark opens the terminal's File menu (whose items the next still marks),
    a type by mark reaches the terminal; an older still's ids are refused naming the field;
    no mark reaches a plain still or the person's live view."""
    srv, rig = desk
    sh(srv, rig, f"pgrep -u rig -x xfce4-terminal >/dev/null || {AS_RIG} setsid -f xfce4-terminal "
                 "--disable-server --geometry 80x24+100+100 >/dev/null 2>&1")
    terminal_ready(srv, rig)
    shot = act(srv, rig, action="screenshot", marks=True)
    named = {(m["role"], m["name"]): m for m in shot["marks"]}
    assert ("toggle button", "Applications") in named and ("menu", "File") in named, shot["marks"]
    term = next(m for m in shot["marks"] if m["role"] == "terminal")
    assert "accessibility tree" in shot["note"]
    assert mark_drawn(rgb(shot["image"]["data"]), term["box"], shot["scale"])
    plain = act(srv, rig, action="screenshot")
    assert not mark_drawn(rgb(plain["image"]["data"]), term["box"], plain["scale"])
    texts, images = _live(_ws_url(srv, srv.call("rig.viewUrl", {"rigId": rig})["path"]), sends=[])
    frame = next(t for t in texts if t["type"] == "frame")
    assert not mark_drawn(rgb(images[0]), term["box"], 1280 / frame["imageSize"]["width"])
    # A click by mark lands on the widget's centre: the File menu opens, and its items are marked.
    file_menu = named[("menu", "File")]
    x, y, w, h = file_menu["box"]
    clicked = act(srv, rig, action="left_click", mark=file_menu["id"])
    assert clicked["coordinate"] == [x + w // 2, y + h // 2] and clicked["mark"] == file_menu["id"]
    end = time.monotonic() + 60
    while True:
        opened = act(srv, rig, action="screenshot", marks=True)
        if any(m["role"] == "menu item" for m in opened["marks"]):
            break
        assert time.monotonic() < end, opened["marks"]
    act(srv, rig, action="key", text="Escape")
    # Ids of an older still are refused, naming the field; nothing is clicked.
    stale = srv.error("rig.act", {"rigId": rig, "tool": "computer_use",
                                  "action": {"action": "left_click", "mark": file_menu["id"]}})
    assert stale["data"]["field"] == "action.mark" and "older still" in stale["message"], stale
    never = srv.error("rig.act", {"rigId": rig, "tool": "computer_use",
                                  "action": {"action": "left_click", "mark": 10**6}})
    assert never["data"]["field"] == "action.mark" and "never issued" in never["message"], never
    # Typing by mark: the terminal widget is clicked first (the focus), then the keys go there.
    terminal_ready(srv, rig)
    again = act(srv, rig, action="screenshot", marks=True)
    term = next(m for m in again["marks"] if m["role"] == "terminal")
    sh(srv, rig, "rm -f /home/rig/marked.txt")
    typed = act(srv, rig, action="type", mark=term["id"], text="echo marked-$((6*7)) > ~/marked.txt\n")
    assert typed["dropped"] == 0, typed
    assert wait_for(srv, rig, "cat /home/rig/marked.txt").strip() == "marked-42"


def xmessage_button(srv: Server, rig: str, geometry: str) -> tuple[int, int, int, int]:
    """Start ``xmessage`` at ``geometry`` with one button (exit 42, written to /tmp/xm.txt);
    return the button's width, height and root x, y, found with xwininfo in the guest."""
    sh(srv, rig, f"rm -f /tmp/xm.txt; ({SESSION} xmessage -geometry {geometry} -buttons hit:42 press; "
                 "echo $? > /tmp/xm.txt) >/dev/null 2>&1 &")
    win = wait_for(srv, rig, f"{SESSION} xdotool search --name '^xmessage$' | head -1 | grep .").strip()
    tree = sh(srv, rig, f"{SESSION} xwininfo -tree -id {win}")
    # Children of the form: "0x… (has no name): ()  WxH+relx+rely  +absx+absy"; the button is the lowest.
    boxes = [tuple(int(v) for v in m) for m in
             re.findall(r"\(\)\s+(\d+)x(\d+)\+(\d+)\+(\d+)\s+\+(\d+)\+(\d+)", tree)]
    w, h, _rx, _ry, ax, ay = max(boxes[1:], key=lambda b: (b[3], -b[1]))
    return w, h, ax, ay


def active_window_centre(srv: Server, rig: str) -> tuple[int, int]:
    """The centre of the active window, in display pixels."""
    geometry = sh(srv, rig, f"{SESSION} xdotool getactivewindow getwindowgeometry --shell")
    box = dict(line.split("=") for line in geometry.split())
    return int(box["X"]) + int(box["WIDTH"]) // 2, int(box["Y"]) + int(box["HEIGHT"]) // 2


def test_a_click_activates_a_known_widget(desk: tuple[Server, str]) -> None:
    """xmessage's button, found with xwininfo in the guest; clicking it exits 42."""
    srv, rig = desk
    w, h, ax, ay = xmessage_button(srv, rig, "+300+300")
    act(srv, rig, action="left_click", coordinate=[ax + w // 2, ay + h // 2])
    assert wait_for(srv, rig, "cat /tmp/xm.txt").strip() == "42"


#: A window that logs every pointer and key event it gets (root coordinates, X server ms).
EVENT_LOG = r"""
import sys
from Xlib import X, XK, Xutil, display
d = display.Display()
s = d.screen()
w = s.root.create_window(100, 100, 600, 400, 0, s.root_depth, X.InputOutput, X.CopyFromParent,
                         background_pixel=s.white_pixel,
                         event_mask=X.ButtonPressMask | X.ButtonReleaseMask | X.PointerMotionMask
                         | X.KeyPressMask | X.KeyReleaseMask | X.StructureNotifyMask)
w.set_wm_name("rigd-event-log")
w.set_wm_normal_hints(flags=Xutil.USPosition | Xutil.USSize, x=100, y=100, width=600, height=400)
w.map()
d.sync()
while d.next_event().type != X.MapNotify:
    pass
w.set_input_focus(X.RevertToParent, X.CurrentTime)
d.sync()
out = open("/tmp/ev.log", "w", buffering=1)
g = w.get_geometry()
pos = w.translate_coords(s.root, 0, 0)
print("ready", -pos.x, -pos.y, g.width, g.height, file=out)
syms = {v: k[3:] for k, v in vars(XK).items() if k.startswith("XK_")}
names = {X.ButtonPress: "press", X.ButtonRelease: "release", X.MotionNotify: "motion",
         X.KeyPress: "kpress", X.KeyRelease: "krelease"}
while True:
    e = d.next_event()
    if e.type in (X.ButtonPress, X.ButtonRelease):
        print(names[e.type], e.detail, e.root_x, e.root_y, e.state, e.time, file=out)
    elif e.type == X.MotionNotify:
        print("motion", e.state & X.Button1Mask and 1 or 0, e.root_x, e.root_y, e.time, file=out)
    elif e.type in (X.KeyPress, X.KeyRelease):
        sym = syms.get(d.keycode_to_keysym(e.detail, 0), "?")
        print(names[e.type], sym, e.state, e.root_x, e.root_y, e.time, file=out)
"""


def test_every_pointer_and_key_verb_reaches_an_x_client(desk: tuple[Server, str]) -> None:
    """Down/up, drag, scroll, the three clicks, hold_key and key combos, as an X client sees them."""
    srv, rig = desk
    sh(srv, rig, f"rm -f /tmp/ev.log; {SESSION} setsid -f python3 -c '{EVENT_LOG}' >/dev/null 2>&1")
    wait_for(srv, rig, "grep -q ready /tmp/ev.log")
    active_window(srv, rig, "^rigd-event-log$")
    # where the window manager put it: every point below must fall inside it
    x0, y0, w, h = (int(v) for v in sh(srv, rig, "head -1 /tmp/ev.log").split()[1:])
    assert x0 <= 200 and y0 <= 200 and x0 + w > 400 and y0 + h > 320, (x0, y0, w, h)

    def events(kind: str) -> list[list[str]]:
        return [line.split()[1:] for line in sh(srv, rig, "cat /tmp/ev.log").splitlines()
                if line.split()[0] == kind]

    def settle(kind: str, count: int) -> list[list[str]]:
        deadline = time.monotonic() + 30
        while len(got := events(kind)) < count:
            assert time.monotonic() < deadline, json.dumps([kind, count, got])
            time.sleep(0.5)
        return got

    act(srv, rig, action="mouse_move", coordinate=[300, 300])
    act(srv, rig, action="left_mouse_down")
    act(srv, rig, action="mouse_move", coordinate=[350, 320])
    act(srv, rig, action="left_mouse_up")
    assert [e[:3] for e in settle("release", 1)] == [["1", "350", "320"]]
    assert [e[:3] for e in events("press")] == [["1", "300", "300"]]
    assert ["1", "350", "320"] in [e[:3] for e in events("motion")]  # moved with the button held

    act(srv, rig, action="left_click_drag", start_coordinate=[200, 200], coordinate=[400, 300])
    assert [e[:3] for e in settle("release", 2)][1] == ["1", "400", "300"]
    assert [e[:3] for e in events("press")][1] == ["1", "200", "200"]

    act(srv, rig, action="scroll", coordinate=[250, 250], scroll_direction="down", scroll_amount=3)
    act(srv, rig, action="scroll", scroll_direction="left", scroll_amount=2)
    act(srv, rig, action="triple_click", coordinate=[260, 260])
    act(srv, rig, action="right_click")
    act(srv, rig, action="middle_click", coordinate=[270, 270])
    presses = [e[:3] for e in settle("press", 2 + 3 + 2 + 3 + 1 + 1)][2:]
    # Wheel notches are buttons 4/5; sideways is shift + wheel up (button 4), as GTK/Qt and
    # browsers expect without a horizontal wheel. (libinput may report a wheel at a later
    # pointer position: the scroll verb waits before returning so the next move cannot overtake.)
    assert [p[0] for p in presses[:5]] == ["5"] * 3 + ["4"] * 2
    assert presses[5:] == [["1", "260", "260"]] * 3 + [["3", "260", "260"], ["2", "270", "270"]]
    assert len(settle("release", 2 + 10)) == 12
    shifted = [e for e in events("press") if e[0] == "4"]
    assert len(shifted) == 2 and all(int(e[3]) & 1 for e in shifted)  # ShiftMask held

    t0 = time.monotonic()
    act(srv, rig, action="hold_key", text="shift", duration=1.5)
    assert time.monotonic() - t0 >= 1.5
    act(srv, rig, action="key", text="ctrl+a Return")
    act(srv, rig, action="wait", duration=0.5)
    kp = settle("kpress", 5)
    kr = settle("krelease", 5)
    # first the shift of the sideways scroll, then hold_key's
    assert [e[0] for e in kp] == ["Shift_L", "Shift_L", "Control_L", "a", "Return"]
    assert [e[0] for e in kr] == ["Shift_L", "Shift_L", "a", "Control_L", "Return"]
    assert int(kp[3][1]) & 4  # ControlMask held while "a" went down
    held_ms = int(kr[1][-1]) - int(kp[1][-1])
    assert 1400 <= held_ms <= 5000, held_ms
    sh(srv, rig, "pkill -f 'rigd-event[-]log' || true")  # [-]: not this shell's own command line


def test_clipboard_round_trips_both_selections(desk: tuple[Server, str]) -> None:
    srv, rig = desk
    text = "zwei 二 \u2603 " + "x" * 1000
    assert act(srv, rig, action="clipboard_write", text=text)["bytes"] == len(text.encode())
    got = act(srv, rig, action="clipboard_read")
    assert got["content"] == {"untrusted": True, "bytes": len(text.encode()), "truncated": False,
                              "text": text}
    # primary: written in the guest (select-to-copy), read through the verb
    sh(srv, rig, f"printf 'from primary' | {SESSION} timeout 20 xclip -selection primary -loops 1 "
                 ">/dev/null 2>&1 &")
    time.sleep(1)
    assert act(srv, rig, action="clipboard_read", selection="primary")["content"]["text"] == "from primary"
    empty = act(srv, rig, action="clipboard_read", selection="xdnd")
    assert empty["content"]["text"] == "" and empty["content"]["bytes"] == 0


def test_ctrl_a_ctrl_c_copies_a_text_field(desk: tuple[Server, str]) -> None:
    """Thunar's location bar (a GtkEntry): Unicode typed in arrives intact and is copied back."""
    srv, rig = desk
    sh(srv, rig, f"{AS_RIG} setsid -f thunar /home/rig >/dev/null 2>&1")
    active_window(srv, rig, "^rig - Thunar|^rig$")
    act(srv, rig, action="key", text="ctrl+l")
    time.sleep(1)
    act(srv, rig, action="key", text="ctrl+a BackSpace")
    typed = act(srv, rig, action="type", text="héllo wörld 世界")
    assert typed["dropped"] == 0
    time.sleep(1)
    act(srv, rig, action="clipboard_write", text="before")
    act(srv, rig, action="key", text="ctrl+a ctrl+c")
    deadline = time.monotonic() + 30
    while (got := act(srv, rig, action="clipboard_read")["content"]["text"]) == "before":
        assert time.monotonic() < deadline, "ctrl+c never replaced the clipboard"
        time.sleep(0.5)
    assert got == "héllo wörld 世界"
    act(srv, rig, action="key", text="Escape ctrl+w")


def test_set_display_changes_the_mode_and_scales_stills(desk: tuple[Server, str]) -> None:
    srv, rig = desk
    changed = act(srv, rig, action="set_display", width=1920, height=1080)
    assert changed["display"] == {"width": 1920, "height": 1080}
    assert srv.call("rig.get", {"rigId": rig})["display"] == {"width": 1920, "height": 1080}
    shot = act(srv, rig, action="screenshot")
    assert shot["display"] == {"width": 1920, "height": 1080}
    assert shot["imageSize"] == {"width": 1280, "height": 720} and shot["scale"] == 1.5
    with Image.open(io.BytesIO(base64.b64decode(shot["image"]["data"]))) as img:
        assert img.size == (1280, 720)
    # Coordinates are pixels of the new mode.
    act(srv, rig, action="mouse_move", coordinate=[1900, 1000])
    assert act(srv, rig, action="cursor_position")["coordinate"] == [1900, 1000]
    assert sh(srv, rig, f"{SESSION} xdpyinfo | grep dimensions").split()[1] == "1920x1080"
    act(srv, rig, action="set_display", width=1280, height=800)


def test_computer_use_tool_returns_an_image(desk: tuple[Server, str]) -> None:
    srv, rig = desk
    tools = srv.call("tools.list")
    names = [t["function"]["name"] for t in tools["tools"]]
    assert "computer_use" in names
    out = srv.call("tools.call", {"workspace": "default", "conversation": "c-tools", "name": "computer_use",
                                  "arguments": {"action": "screenshot", "rigId": rig}})
    assert out["isError"] is False
    image = next(c for c in out["content"] if c["type"] == "image")
    assert image["mimeType"] == "image/jpeg"
    with Image.open(io.BytesIO(base64.b64decode(image["data"]))) as img:
        assert img.format == "JPEG"
    text = next(c for c in out["content"] if c["type"] == "text")["text"]
    assert "display 1280x800" in text


def _ws_url(srv: Server, path: str) -> str:
    return srv.url.replace("http://", "ws://") + path


def _live(url: str, *, sends: list[dict[str, Any]], frames: int = 1) -> tuple[list[dict[str, Any]], list[bytes]]:
    """Read ``frames`` frames from the live view, then send ``sends`` and wait for a pong."""
    texts: list[dict[str, Any]] = []
    images: list[bytes] = []
    with connect(url, max_size=None, open_timeout=60) as ws:
        while len(images) < frames:
            msg = ws.recv(timeout=120)
            if isinstance(msg, bytes):
                images.append(msg)
            else:
                texts.append(json.loads(msg))
        for s in [*sends, {"type": "ping"}]:
            ws.send(json.dumps(s))
        while not any(t.get("type") == "pong" for t in texts):
            msg = ws.recv(timeout=60)
            if isinstance(msg, str):
                texts.append(json.loads(msg))
    return texts, images


def test_live_view_is_view_only_without_control(desk: tuple[Server, str]) -> None:
    srv, rig = desk
    view = srv.call("rig.viewUrl", {"rigId": rig})
    assert view["path"].startswith(f"/rig/live/{rig}?")
    texts, images = _live(_ws_url(srv, view["path"]), sends=[{"type": "move", "x": 10, "y": 10}])
    hello = texts[0]
    assert hello["type"] == "hello" and hello["control"] is False
    frame = next(t for t in texts if t["type"] == "frame")
    assert frame["display"] == {"width": 1280, "height": 800}
    with Image.open(io.BytesIO(images[0])) as img:
        assert img.size == (frame["imageSize"]["width"], frame["imageSize"]["height"])
    refused = [t for t in texts if t["type"] == "error"]
    assert refused and refused[0]["field"] == "control", texts
    assert "someone is watching" in srv.call("rig.get", {"rigId": rig})["pins"]
    # The rig-view signature works nowhere else.
    term = view["path"].replace("/rig/live/", "/rig/term/")
    with pytest.raises(InvalidStatus) as rejected:
        connect(_ws_url(srv, term), open_timeout=30)
    assert rejected.value.response.status_code == 401


def test_live_view_input_from_the_person_in_control(desk: tuple[Server, str]) -> None:
    srv, rig = desk
    srv.call("rig.control", {"rigId": rig, "op": "take"})
    try:
        view = srv.call("rig.viewUrl", {"rigId": rig})
        texts, _ = _live(_ws_url(srv, view["path"]), sends=[{"type": "move", "x": 640, "y": 123}])
        assert texts[0]["control"] is True
        assert not [t for t in texts if t["type"] == "error"], texts
        assert act(srv, rig, action="cursor_position")["coordinate"] == [640, 123]
        log = srv.call("rig.log", {"rigId": rig})
        moves = [r for r in log if r["tool"] == "live_view"]
        assert moves and moves[-1]["args"] == {"type": "move", "x": 640, "y": 123}
    finally:
        srv.call("rig.control", {"rigId": rig, "op": "release"})


def _frames_until_quiet(ws: Any, quiet_s: float, deadline_s: float) -> list[dict[str, Any]]:
    """Frame messages until none came for ``quiet_s`` (the screen went idle)."""
    frames: list[dict[str, Any]] = []
    end = time.monotonic() + deadline_s
    while True:
        try:
            msg = ws.recv(timeout=quiet_s)
        except TimeoutError:
            return frames
        if isinstance(msg, str) and json.loads(msg).get("type") == "frame":
            frames.append(json.loads(msg))
        assert time.monotonic() < end, f"the screen never went quiet for {quiet_s} s: {frames[-5:]}"


def _next_frame(ws: Any, within_s: float) -> tuple[dict[str, Any], float]:
    t0 = time.monotonic()
    while True:
        msg = ws.recv(timeout=max(0.1, within_s - (time.monotonic() - t0)))
        if isinstance(msg, str) and json.loads(msg).get("type") == "frame":
            return json.loads(msg), time.monotonic() - t0


def test_live_view_grabs_only_when_the_screen_changes(desk: tuple[Server, str]) -> None:
    srv, rig = desk
    view = srv.call("rig.viewUrl", {"rigId": rig})
    with connect(_ws_url(srv, view["path"]), max_size=None, open_timeout=60) as ws:
        hello = json.loads(ws.recv(timeout=60))
        assert hello["type"] == "hello"
        frames = _frames_until_quiet(ws, quiet_s=2.0, deadline_s=120)
        first = frames[0]
        assert first["trigger"] == "open" and first["source"] in ("agent", "qmp")
        assert first["lane"]["source"] == first["source"] and first["lane"]["why"].startswith("measured: ")
        idle_grabs = frames[-1]["grabs"]
        idle_from = time.monotonic() - 2.0  # the quiet window began with the last frame
        # A pointer move (no X damage: the host knows it moved it) yields a frame promptly,
        # and few grabs were made while the screen was idle: the old polling loop grabbed
        # every ~0.85 s whatever happened; here only a redraw of unchanged pixels (the panel
        # may redraw its clock) costs a grab, and it sends nothing. Seen: 0-3 grabs in ~3 s.
        act(srv, rig, action="mouse_move", coordinate=[700, 333])
        moved, took = _next_frame(ws, within_s=10)
        idle_s = time.monotonic() - idle_from
        assert "pointer" in moved["trigger"], moved
        # Idle grabs are bounded by the redraws of unchanged pixels (the panel's clock, about
        # one a second, and what a busy host merges late), and none of them sent a frame: the
        # quiet window above saw none. Not a timing assertion: how long the frame took is
        # the bench's business (bench/computer.py).
        assert moved["grabs"] - idle_grabs - 1 <= 2 + int(1.5 * idle_s), (moved, idle_grabs, idle_s, took)
        _frames_until_quiet(ws, quiet_s=2.0, deadline_s=60)
        # A window drawn in the guest: the agent's damage notice brings the frame.
        sh(srv, rig, f"{AS_RIG} nohup python3 -c \"import time; from Xlib import X, display; d = display.Display(); "
                     "s = d.screen(); w = s.root.create_window(100, 100, 200, 150, 0, s.root_depth, "
                     "X.InputOutput, X.CopyFromParent, background_pixel=s.black_pixel, override_redirect=True); "
                     "w.map(); d.sync(); time.sleep(4)\" >/dev/null 2>&1 &")
        drawn, _took = _next_frame(ws, within_s=30)
        assert "damage" in drawn["trigger"], drawn
        # ...and when it is gone the screen is idle again: no frame for 2 s.
        _frames_until_quiet(ws, quiet_s=2.0, deadline_s=60)


def test_audit_masks_typed_text(desk: tuple[Server, str]) -> None:
    srv, rig = desk
    log = srv.call("rig.log", {"rigId": rig})
    typed = [r for r in log if r["verb"] == "type"]
    assert typed and all(set(r["args"]["text"]) == {"len", "sha256"} for r in typed)
    assert "rig-$((6*7))" not in json.dumps(log)


def test_a_drop_lands_in_drops_with_its_uris_on_the_clipboard(desk: tuple[Server, str],
                                                               tmp_path: Path) -> None:
    from rigd.client.lanes import LaneClient, LaneError

    srv, rig = desk
    sh(srv, rig, "mkdir -p /home/rig/Drops && printf old > /home/rig/Drops/notes.txt")
    # 24 MB spans many of the lane's chunks; the 200 MB transit (up, checked in the guest, and
    # back out) is test_lanes' (a terminal rig: the same agent file ops, without TCG's X session
    # beside the guest's sha256sum).
    big = tmp_path / "big.bin"
    with big.open("wb") as fh:
        for _ in range(24):
            fh.write(os.urandom(1 << 20))
    resume = tmp_path / "résumé 2.pdf"
    resume.write_bytes(b"%PDF-1.4 " + os.urandom(4096))
    notes = tmp_path / "notes.txt"
    notes.write_text("new\n")
    lanes = LaneClient(srv.url, srv.token, timeout=900)
    answer = lanes.upload(rig, [big, resume, notes], point=(640, 400))
    assert answer["told"] == "clipboard" and answer["dir"] == "/home/rig/Drops"
    paths = [x["path"] for x in answer["saved"]]
    assert paths == ["/home/rig/Drops/big.bin", "/home/rig/Drops/résumé 2.pdf", "/home/rig/Drops/2-notes.txt"]
    sums = sh(srv, rig, "cd /home/rig/Drops && sha256sum big.bin 'résumé 2.pdf' 2-notes.txt; "
                        "stat -c %U big.bin; cat notes.txt", timeout_s=300)
    for f, path in zip([big, resume, notes], paths, strict=True):
        assert f"{hashlib.sha256(f.read_bytes()).hexdigest()}  {path.rsplit('/', 1)[1]}" in sums
    assert sums.endswith("rig\nold")
    # The files' URIs are the desktop's clipboard (an X client in the guest reads them).
    uris = sh(srv, rig, f"{SESSION} xclip -o -selection clipboard -t text/uri-list")
    assert uris.split() == ["file:///home/rig/Drops/big.bin", "file:///home/rig/Drops/r%C3%A9sum%C3%A9%202.pdf",
                            "file:///home/rig/Drops/2-notes.txt"]
    out = lanes.download(rig, "/home/rig/Drops/résumé 2.pdf", tmp_path / "back.pdf")
    assert out["sha256"] == hashlib.sha256(resume.read_bytes()).hexdigest()
    # A view URL cannot drop; a 600 MB drop is refused before a byte reaches the guest.
    view = srv.call("rig.viewUrl", {"rigId": rig})["path"].split("?", 1)[1]
    with pytest.raises(LaneError, match="HTTP 401"):
        LaneClient(srv.url, "not-a-token").upload(rig, [notes])
    import http.client
    import urllib.parse

    conn = http.client.HTTPConnection(urllib.parse.urlsplit(srv.url).netloc, timeout=60)
    conn.request("POST", f"/rig/files/{rig}?{view}", body=b"", headers={
        "Content-Type": "multipart/form-data; boundary=x"})
    assert conn.getresponse().status == 401
    conn.close()
    conn = http.client.HTTPConnection(urllib.parse.urlsplit(srv.url).netloc, timeout=60)
    conn.request("POST", f"/rig/files/{rig}", body=b"", headers={
        "Authorization": f"Bearer {srv.token}", "Content-Type": "multipart/form-data; boundary=x",
        "Content-Length": str(600 << 20)})
    assert conn.getresponse().status == 413
    conn.close()
    assert sh(srv, rig, "ls -A /home/rig/Drops | grep -c rigd-drop || true").strip() == "0"
    rows = srv.call("rig.log", {"rigId": rig})
    drop = next(r for r in rows if r["verb"] == "drop_files" and r["outcome"] == "ok")
    assert drop["args"]["told"] == "clipboard" and drop["args"]["x"] == 640


def test_clipboard_lane_images_in_and_copy_out_asks_first(desk: tuple[Server, str]) -> None:
    from rigd.client.lanes import LaneClient, LaneError

    srv, rig = desk
    lanes = LaneClient(srv.url, srv.token, timeout=120)
    buf = io.BytesIO()
    Image.new("RGB", (64, 48), (200, 30, 60)).save(buf, "PNG")
    assert lanes.clip_set(rig, buf.getvalue(), "image/png")["type"] == "image/png"
    # An X client in the guest reads it as an image.
    probe = sh(srv, rig, f"{SESSION} xclip -o -selection clipboard -t image/png | python3 -c "
                         "\"import sys,io; from PIL import Image; i=Image.open(io.BytesIO(sys.stdin.buffer.read())); "
                         "print(i.format, i.size, i.getpixel((3,3)))\"")
    assert probe.strip() == "PNG (64, 48) (200, 30, 60)"
    # rig → host asks first, then works after a grant; the log has the shape only.
    srv.call("clipboard.policy.set", {"rigToHost": "ask"})
    with pytest.raises(LaneError, match=r"HTTP 403.*clipboard"):
        lanes.clip_get(rig)
    srv.call("clipboard.grant", {"rigId": rig})
    media, data = lanes.clip_get(rig)
    assert media == "image/png" and data == buf.getvalue()
    assert lanes.clip_set(rig, "pässwörd 42".encode(), "text/plain; charset=utf-8")["selections"] == [
        "clipboard", "primary"]
    assert sh(srv, rig, f"{SESSION} xclip -o -selection primary") == "pässwörd 42"
    assert lanes.clip_get(rig) == ("text/plain; charset=utf-8", "pässwörd 42".encode())
    rows = json.dumps(srv.call("rig.log", {"rigId": rig}))
    assert "pässwörd" not in rows and '"clipboard_write"' in rows and '"clipboard_read"' in rows


def vendor(srv: Server, rig: str, dialect: str, token: str | None = None, name: str = "computer",
           **arguments: Any) -> dict[str, Any]:
    """One call of a vendor's computer tool through ``tools.call {dialect}``."""
    return dict(srv.call("tools.call", {"workspace": "default", "conversation": "c-vendor", "dialect": dialect,
                                        "name": name, "arguments": {"rigId": rig, **arguments}}, token=token))


def decoded(result: dict[str, Any]) -> Image.Image:
    """The one image of a tool result, decoded (the caller closes it)."""
    [image] = [c for c in result["content"] if c["type"] == "image"]
    assert image["mimeType"] == "image/jpeg"
    img = Image.open(io.BytesIO(base64.b64decode(image["data"])))
    img.load()
    return img


def text(result: dict[str, Any]) -> str:
    return "\n".join(c["text"] for c in result["content"] if c["type"] == "text")


def fresh_terminal_gone(srv: Server, rig: str) -> None:
    """No terminal window is open (the next one a test opens is the active one)."""
    sh(srv, rig, "pkill -u rig xfce4-terminal || true")
    wait_for(srv, rig, f"! {SESSION} xdotool search --class xfce4-terminal >/dev/null")


def test_anthropic_actions_open_a_terminal_and_type_a_command(desk: tuple[Server, str]) -> None:
    """The documented computer_20250124 loop: screenshot, key, type, key Return, a scroll and a
    shift-click; the typed command's effect read back by exec."""
    srv, rig = desk
    fresh_terminal_gone(srv, rig)
    sh(srv, rig, "rm -f /home/rig/anthropic.txt")
    shot = vendor(srv, rig, "anthropic", action="screenshot")
    assert shot["isError"] is False, shot
    with decoded(shot) as img:
        assert img.size == (1280, 800)
    assert "1280x800 image of the 1280x800 display, scale 1.0" in text(shot), text(shot)
    # XFCE's own shortcut for a terminal (xfsettingsd's grab sees the key as any key).
    opened = vendor(srv, rig, "anthropic", action="key", text="ctrl+alt+t")
    assert opened["isError"] is False and "key: done" in text(opened), opened
    terminal_ready(srv, rig)
    for step in ({"action": "type", "text": "echo anthropic-$((6*7)) > ~/anthropic.txt"},
                 {"action": "key", "text": "Return"}):
        out = vendor(srv, rig, "anthropic", **step)
        assert out["isError"] is False, out
    assert wait_for(srv, rig, "cat /home/rig/anthropic.txt").strip() == "anthropic-42"
    cx, cy = active_window_centre(srv, rig)
    scrolled = vendor(srv, rig, "anthropic", action="scroll", coordinate=[cx, cy], scroll_direction="down",
                      scroll_amount=3)
    assert scrolled["isError"] is False, scrolled
    clicked = vendor(srv, rig, "anthropic", action="left_click", coordinate=[cx, cy], text="shift")
    assert clicked["isError"] is False, clicked
    # Another dialect's shape, or a point off the screenshot: a readable error naming the field.
    foreign = vendor(srv, rig, "anthropic", action="left_click", x=10, y=10)
    assert foreign["isError"] is True and "arguments.x" in text(foreign), foreign
    off = vendor(srv, rig, "anthropic", action="left_click", coordinate=[1280, 10])
    assert off["isError"] is True and "arguments.coordinate" in text(off), off
    vendor(srv, rig, "anthropic", action="type", text="exit\n")


def test_openai_computer_actions_in_one_call_type_a_command(desk: tuple[Server, str]) -> None:
    """OpenAI's computer_call actions (keypress, wait, click, type) — several in one call, one
    screenshot after them."""
    srv, rig = desk
    fresh_terminal_gone(srv, rig)
    sh(srv, rig, "rm -f /home/rig/openai.txt")
    opened = vendor(srv, rig, "openai-computer", actions=[{"type": "keypress", "keys": ["CTRL", "ALT", "T"]},
                                                          {"type": "wait"}])
    assert opened["isError"] is False, opened
    terminal_ready(srv, rig)
    cx, cy = active_window_centre(srv, rig)
    out = vendor(srv, rig, "openai-computer", actions=[
        {"type": "click", "button": "left", "x": cx, "y": cy},
        {"type": "type", "text": "echo openai-$((6*7)) > ~/openai.txt"},
        {"type": "keypress", "keys": ["ENTER"]},
    ])
    assert out["isError"] is False, out
    assert [c["type"] for c in out["content"]].count("image") == 1, out
    assert "click, type, keypress: done" in text(out), text(out)
    assert wait_for(srv, rig, "cat /home/rig/openai.txt").strip() == "openai-42"
    bad = vendor(srv, rig, "openai-computer", actions=[{"type": "click", "button": "left", "coordinate": [1, 1]}])
    assert bad["isError"] is True and "arguments.actions[0]" in text(bad), bad
    vendor(srv, rig, "openai-computer", action={"type": "type", "text": "exit\n"})


#: Block means of a region of the guest's own screen at full resolution (PIL in the guest).
GRAB = ("python3 -c 'import json, sys; from PIL import ImageGrab; "
        "box = tuple(int(v) for v in sys.argv[1:5]); "
        "im = ImageGrab.grab(bbox=box, xdisplay=\":0\").convert(\"L\").resize((16, 9), 4); "
        "print(json.dumps(list(im.getdata())))'")


def test_a_click_on_a_downscaled_screenshot_lands_and_zoom_is_at_display_resolution(
        desk: tuple[Server, str]) -> None:
    """At 1920x1080 the model sees a 1280x720 screenshot (scale 1.5): a click computed on it hits
    xmessage's button; zoom returns a region at the display's own pixels."""
    srv, rig = desk
    fresh_terminal_gone(srv, rig)
    act(srv, rig, action="set_display", width=1920, height=1080)
    try:
        w, h, ax, ay = xmessage_button(srv, rig, "+600+500")
        shot = vendor(srv, rig, "anthropic", action="screenshot")
        with decoded(shot) as img:
            assert img.size == (1280, 720)
        assert "1280x720 image of the 1920x1080 display, scale 1.5" in text(shot), text(shot)
        # The button's centre in pixels of the image the model was sent.
        ix, iy = round((ax + w / 2) / 1.5), round((ay + h / 2) / 1.5)
        clicked = vendor(srv, rig, "anthropic", action="left_click", coordinate=[ix, iy])
        assert clicked["isError"] is False, clicked
        assert wait_for(srv, rig, "cat /tmp/xm.txt").strip() == "42"
        # Outside the 1280x720 frame is refused, not clamped (1280 would be a display pixel).
        off = vendor(srv, rig, "anthropic", action="left_click", coordinate=[1280, 700])
        assert off["isError"] is True and "outside the screenshot" in text(off), off

        # Something to see in the region: a window of text (the desktop behind it is one colour).
        sh(srv, rig, f"{SESSION} setsid -f xmessage -geometry +700+400 'zoom target: the quick brown fox "
                     "jumps over the lazy dog 0123456789' >/dev/null 2>&1")
        wait_for(srv, rig, f"{SESSION} xdotool search --name '^xmessage$' | grep .")
        region = [480, 270, 1440, 810]  # 960x540 display pixels
        grab = f"{SESSION} {GRAB} {' '.join(map(str, region))}"
        deadline = time.monotonic() + 60
        while max(seen := json.loads(sh(srv, rig, grab))) - min(seen) <= 20:  # drawn yet?
            assert time.monotonic() < deadline, f"the window never showed in the region: {seen}"
            time.sleep(0.5)
        zoom = act(srv, rig, action="zoom", region=region)
        assert zoom["imageSize"] == {"width": 960, "height": 540} and zoom["scale"] == 1.0, zoom
        assert zoom["display"] == {"width": 1920, "height": 1080} and zoom["region"] == region
        with Image.open(io.BytesIO(base64.b64decode(zoom["image"]["data"]))) as img:
            assert img.size == (960, 540)
            ours = list(img.convert("L").resize((16, 9), Image.Resampling.BOX).tobytes())
        theirs = json.loads(sh(srv, rig, grab))
        assert max(abs(a - b) for a, b in zip(ours, theirs, strict=True)) <= 16, (ours, theirs)
        small = act(srv, rig, action="zoom", region=[100, 100, 420, 300])
        assert small["imageSize"] == {"width": 320, "height": 200}, small
        # The anthropic zoom names its region in screenshot pixels; it comes back at display pixels.
        az = vendor(srv, rig, "anthropic", action="zoom", region=[320, 180, 960, 540])
        with decoded(az) as img:
            assert img.size == (960, 540)
        assert "at the display's own resolution" in text(az)
        bad = srv.error("rig.act", {"rigId": rig, "tool": "computer_use",
                                    "action": {"action": "zoom", "region": [0, 0, 1921, 10]}})
        assert bad["data"]["field"] == "action.region", bad
    finally:
        sh(srv, rig, "pkill xmessage || true")
        act(srv, rig, action="set_display", width=1280, height=800)


def test_read_only_refuses_and_ask_first_waits_for_a_person(desk: tuple[Server, str]) -> None:
    """guard.readOnly refuses terminal_use; guard.askFirst makes computer_use wait for
    approval.decide by a person; a denial is a readable tool error; guard.log keeps both."""
    srv, rig = desk
    for name, kind in (("desk-bot", "agent"), ("alice", "person")):
        srv.call("user.create", {"name": name, "kind": kind})
        srv.call("member.add", {"workspace": "default", "user": name})
    bot = str(srv.call("token.create", {"user": "desk-bot"})["token"])
    alice = str(srv.call("token.create", {"user": "alice"})["token"])

    def setting(key: str, value: Any) -> None:
        srv.call("workspace.settings.set", {"workspace": "default", "key": key, "value": value})

    def tool(result: list[dict[str, Any]], name: str, arguments: dict[str, Any]) -> None:
        result.append(srv.call("tools.call", {"workspace": "default", "conversation": "c-guard", "name": name,
                                              "arguments": {"rigId": rig, **arguments},
                                              "approvalTimeoutS": 240}, token=bot))

    setting("guard.readOnly", True)
    try:
        refused: list[dict[str, Any]] = []
        tool(refused, "terminal_use", {"action": "exec", "argv": ["touch", "/tmp/ro"]})
        assert refused[0]["isError"] is True and "read-only" in text(refused[0]), refused
        assert "ro" not in sh(srv, rig, "ls /tmp").split()
        assert srv.call("tools.call", {"workspace": "default", "conversation": "c-guard", "name": "rig_list",
                                       "arguments": {}}, token=bot)["isError"] is False
    finally:
        setting("guard.readOnly", None)

    setting("guard.askFirst", ["processSpawn"])
    try:
        for allow in (True, False):
            result: list[dict[str, Any]] = []
            waiter = threading.Thread(target=tool, args=(result, "computer_use", {"action": "screenshot"}))
            waiter.start()
            try:
                deadline = time.monotonic() + 60
                while not (waiting := srv.call("approval.list", {"workspace": "default"}, token=alice)):
                    assert time.monotonic() < deadline, "the call never asked"
                    time.sleep(0.2)
                assert [w["tool"] for w in waiting] == ["computer_use"] and not result
                srv.call("approval.decide", {"approvalId": waiting[0]["approvalId"], "allow": allow},
                         token=alice)
            finally:
                waiter.join(timeout=300)
            [out] = result
            assert out["approval"]["decidedBy"]["name"] == "alice", out
            if allow:
                assert out["isError"] is False and "approved by alice" in text(out), text(out)
                with decoded(out) as img:
                    assert img.size == (1280, 800)
            else:
                assert out["isError"] is True and "alice (a person) denied this computer_use call" in text(out)
        rows = srv.call("guard.log", {"workspace": "default"})
        assert [r["decision"] for r in rows][-3:] in (["readOnly", "allowed", "denied"],
                                                      ["denied", "allowed", "readOnly"]), rows
    finally:
        setting("guard.askFirst", None)


async def test_mcp_clients_take_a_desktop_screenshot(desk: tuple[Server, str], tmp_path: Path) -> None:
    """An MCP client from the SDK, over stdio and over /mcp, gets the desktop as image content."""
    srv, rig = desk

    async def screenshot(client: Client) -> None:
        shot = await client.call_tool("computer_use", {"action": "screenshot", "rigId": rig})
        assert shot.is_error is False, text_of(shot)
        [image] = images_of(shot)
        assert image.mime_type == "image/jpeg"
        with Image.open(io.BytesIO(base64.b64decode(image.data))) as img:
            assert img.format == "JPEG" and img.size == (1280, 800)
        assert "display 1280x800" in text_of(shot), text_of(shot)
        bad = await client.call_tool("computer_use", {"action": "left_click", "coordinate": [5000, 1],
                                                      "rigId": rig})
        assert bad.is_error is True and "coordinate" in text_of(bad)

    with trio.fail_after(300):
        async with stdio_mcp(srv, tmp_path, "c-mcp-desk") as (client, _errlog):
            await screenshot(client)
        async with http_mcp(srv, srv.token, timeout_s=240,
                            **{WORKSPACE_HEADER: "default", CONVERSATION_HEADER: "c-mcp-desk"}) as client:
            await screenshot(client)


def test_rigd_agent_does_a_task_on_the_desktop_and_leaves_a_rig_it_did_not_open(
        desk: tuple[Server, str], tmp_path: Path) -> None:
    """The reference loop on a real desktop: the scripted model opens a terminal with a key, waits
    for it through exec (as the desktop's user, in its session), types a command, and looks; the
    endpoint is sent each screenshot as an image, only the newest two kept."""
    srv, rig = desk
    fresh_terminal_gone(srv, rig)
    sh(srv, rig, "rm -f /home/rig/agent.txt")
    wait_terminal = ("for i in $(seq 120); do xdotool getactivewindow getwindowname | grep -q ^Terminal "
                     f"&& {TERMINAL_SHELL} >/dev/null && exit 0; sleep 1; done; exit 1")
    steps: list[Any] = [
        {"content": "Opening a terminal.", "tool_calls": [
            tool_call("c1", "computer_use", {"action": "screenshot", "rigId": rig}),
            tool_call("c2", "computer_use", {"action": "key", "text": "ctrl+alt+t", "rigId": rig})]},
        {"content": None, "tool_calls": [tool_call("c3", "terminal_use", {
            "action": "exec", "command": wait_terminal, "timeoutS": 150, "rigId": rig})]},
        {"content": None, "tool_calls": [tool_call("c4", "computer_use", {
            "action": "type", "text": "echo agent-$((6*7)) > ~/agent.txt\n", "rigId": rig}),
            tool_call("c4s", "computer_use", {"action": "screenshot", "rigId": rig})]},
        {"content": None, "tool_calls": [
            tool_call("c5s", "computer_use", {"action": "screenshot", "rigId": rig}),
            tool_call("c5", "terminal_use", {"action": "exec", "command": "cat ~/agent.txt", "rigId": rig})]},
        {"content": "Done: ~/agent.txt says agent-42."},
    ]
    with scripted_endpoint(steps) as endpoint:
        proc = run_agent(srv, endpoint, tmp_path, "--conversation", "c-agent-desk", timeout_s=400,
                         task="Open a terminal on the desktop and write agent-42 to ~/agent.txt.")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert len(endpoint.requests) == 5
    assert wait_for(srv, rig, "cat /home/rig/agent.txt").strip() == "agent-42"
    last = endpoint.requests[4]["body"]["messages"]
    [read] = [m for m in last if m.get("tool_call_id") == "c5"]
    assert "agent-42" in read["content"], read
    # Screenshots went to the model as images (three calls returned one each); the newest two are kept.
    urls = [p["image_url"]["url"] for m in last if isinstance(m.get("content"), list)
            for p in m["content"] if p.get("type") == "image_url"]
    assert len(urls) == 2 and all(u.startswith("data:image/jpeg;base64,") for u in urls), urls
    with Image.open(io.BytesIO(base64.b64decode(urls[-1].split(",", 1)[1]))) as img:
        assert img.size == (1280, 800)
    # The desktop was the module's, not the run's: it stays open.
    assert srv.call("rig.get", {"rigId": rig})["phase"] == "ready"
    assert "closed" not in proc.stdout
    sh(srv, rig, "pkill -u rig xfce4-terminal || true")


def test_a_second_desktop_starts_warm_and_is_its_own_machine(desk: tuple[Server, str]) -> None:
    """The shape has a snapshot (desktop_server seeded one); the next rig is restored from it."""
    srv, rig = desk
    t0 = time.monotonic()
    second = srv.call("rig.open", {"workspace": "default", "surface": "computer", **DESKTOP_SHAPE})
    took = time.monotonic() - t0
    try:
        assert second["boot"] == "warm", second
        print(f"warm desktop in {took:.1f} s")
        ids = {sh(srv, r, "cat /etc/machine-id").strip() for r in (rig, second["id"])}
        assert len(ids) == 2
        shot = act(srv, second["id"], action="screenshot")
        with Image.open(io.BytesIO(base64.b64decode(shot["image"]["data"]))) as img:
            colours = img.convert("RGB").getcolors(1 << 20)
            assert colours is not None and len(colours) > 8  # a drawn desktop
        act(srv, second["id"], action="mouse_move", coordinate=[77, 66])
        assert act(srv, second["id"], action="cursor_position")["coordinate"] == [77, 66]
    finally:
        srv.call("rig.close", {"rigId": second["id"]})


def test_a_desktop_fork_shows_the_same_windows(desk: tuple[Server, str]) -> None:
    """rig.fork of a desktop (issue 29): the copy's X session has the parent's windows, where
    they were, and goes on as a machine of its own."""
    srv, rig = desk
    title = f"fork-{uuid.uuid4().hex[:8]}"
    sh(srv, rig, f"({SESSION} xmessage -title {title} -geometry 320x90+60+70 forked &) >/dev/null 2>&1")
    find = f"{SESSION} xdotool search --name '^{title}$' | head -1 | grep ."
    win = wait_for(srv, rig, find).strip()
    where = f"{SESSION} xdotool getwindowgeometry --shell {{}} | grep -E '^(X|Y|WIDTH|HEIGHT)='"
    geometry = sh(srv, rig, where.format(win))
    t0 = time.monotonic()
    try:
        [copy] = srv.call("rig.fork", {"rigId": rig, "count": 1})["rigs"]
        print(f"desktop fork ready in {time.monotonic() - t0:.1f} s")
        assert copy["phase"] == "ready" and copy["forkedFrom"] == rig, copy
        assert copy["display"] == srv.call("rig.get", {"rigId": rig})["display"]
        copied = sh(srv, copy["id"], find).strip()
        assert sh(srv, copy["id"], where.format(copied)) == geometry
        ids = {sh(srv, r, "cat /etc/machine-id").strip() for r in (rig, copy["id"])}
        assert len(ids) == 2
        # The copy's windows are its own: closing one there leaves the parent's.
        sh(srv, copy["id"], "pkill -x xmessage")
        wait_for(srv, copy["id"], f"! {find}")
        assert sh(srv, rig, find).strip() == win
        act(srv, copy["id"], action="mouse_move", coordinate=[91, 92])
        assert act(srv, copy["id"], action="cursor_position")["coordinate"] == [91, 92]
        srv.call("rig.close", {"rigId": copy["id"]})
    finally:
        sh(srv, rig, "pkill -x xmessage || true")


def test_import_with_a_wrong_checksum_leaves_no_file(tmp_path: Path) -> None:
    from rigd.client.cli import main
    from rigd.images.importer import images_dir

    image = find_desktop()
    data_dir = make_data_dir()
    try:
        code = main(["images", "import", str(image.manifest_path), "--sha256", "0" * 64,
                     "--data-dir", str(data_dir)])
        assert code == 2
        left = [p for p in images_dir(data_dir).rglob("*")] if images_dir(data_dir).exists() else []
        assert left == []
    finally:
        remove_tree(data_dir)
    assert os.path.exists(image.disk)
