"""Guest protocol 2: the agent's desktop ops, on the host.

Three tiers, none of which boots a VM:

- pure functions of the agent (scaling, the cursor mark, CVT modelines,
  ``xrandr`` parsing, the session file), imported straight from
  ``guest-agent/rigd_agent/x11.py``;
- a terminal agent (no X session): protocol 1, and the desktop ops refused
  with "no display";
- a desktop agent against a real X server: Xvfb with a cookie, the agent run
  by Debian's ``/usr/bin/python3`` with ``python3-pil`` and ``python3-xlib``
  (as in the desktop image), ``xrandr``, ``xclip`` and ``xdotool``
  (``scripts/apt-packages.txt``). Skipped where those are missing.
"""

from __future__ import annotations

import base64
import io
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from PIL import Image
from rigd_agent import x11

from rigd.protocols.guest import Ready, Reply, Stream
from tests.unit.guest_agent import agent_dir
from tests.unit.test_agent import AgentHarness

SYSTEM_PYTHON = "/usr/bin/python3"
ALL_FEATURES = ["screen", "cursor", "display", "set_display", "clipboard_read", "clipboard_write", "session_env",
                "clipboard_image", "clipboard_files", "keymap", "damage", "files"]  # fmt: skip
TEXT = "héllo wörld 世界"


agent_mod = x11  # the desktop's pure functions


# --------------------------------------------------------------------------
# pure functions


@pytest.mark.parametrize(
    ("display", "limit", "expected"),
    [
        ((1280, 800), (1280, 800), (1280, 800, 1.0)),
        ((1920, 1080), (1280, 800), (1280, 720, 1.5)),
        ((2560, 1600), (1280, 800), (1280, 800, 2.0)),
        ((2560, 1600), (2560, 1600), (2560, 1600, 1.0)),
        ((1024, 768), (1280, 800), (1024, 768, 1.0)),  # never scaled up
        ((1366, 768), (1280, 800), (1280, 720, 1366 / 1280)),
        ((800, 1280), (1280, 800), (500, 800, 1.6)),  # portrait: the height decides
        ((2560, 1080), (1280, 800), (1280, 540, 2.0)),
        ((640, 480), (16, 16), (16, 12, 40.0)),
    ],
)
def test_fit_size(display: tuple[int, int], limit: tuple[int, int], expected: tuple[int, int, float]) -> None:
    w, h, scale = agent_mod.fit_size(*display, *limit)
    assert (w, h) == expected[:2]
    assert scale == pytest.approx(expected[2])
    assert w <= limit[0] and h <= limit[1]
    # a point of the image maps back onto the screen within a pixel
    assert abs((w - 1) * scale - (display[0] - 1)) <= scale + 1


def magenta(px: tuple[int, ...]) -> bool:
    """The mark's colour, as it survives JPEG's chroma subsampling."""
    r, g, b = px[:3]
    return r > 150 and b > 150 and g < 110


def mark_pixels(image: Image.Image, x: float, y: float, radius: int = 14) -> int:
    rgb = image.convert("RGB")
    count = 0
    for yy in range(max(0, int(y) - radius), min(rgb.height, int(y) + radius + 1)):
        for xx in range(max(0, int(x) - radius), min(rgb.width, int(x) + radius + 1)):
            if magenta(rgb.getpixel((xx, yy))):  # type: ignore[arg-type]
                count += 1
    return count


@pytest.mark.parametrize("background", [(0, 0, 0), (255, 255, 255), (90, 140, 200)])
def test_mark_cursor_draws_a_ring_around_the_hot_spot(background: tuple[int, int, int]) -> None:
    image = Image.new("RGB", (200, 100), background)
    agent_mod.mark_cursor(image, 50, 40)
    assert image.getpixel((50, 40)) == background  # the hot spot itself stays visible
    assert magenta(image.getpixel((50 + agent_mod.MARK_RADIUS, 40)))  # type: ignore[arg-type]
    assert magenta(image.getpixel((50, 40 - agent_mod.MARK_RADIUS - 3)))  # type: ignore[arg-type]
    assert mark_pixels(image, 50, 40) > 60
    assert mark_pixels(image, 150, 40) == 0  # nothing drawn elsewhere
    # it survives JPEG
    data = agent_mod.encode_image(image, "jpeg", 75)
    decoded = Image.open(io.BytesIO(data))
    assert decoded.format == "JPEG" and decoded.size == (200, 100)
    assert mark_pixels(decoded, 50, 40) > 30


def test_mark_cursor_at_the_edge_is_clipped_not_an_error() -> None:
    image = Image.new("RGB", (64, 48), (255, 255, 255))
    agent_mod.mark_cursor(image, 0, 0)
    agent_mod.mark_cursor(image, 63, 47)
    assert mark_pixels(image, 0, 0) > 10 and mark_pixels(image, 63, 47) > 10


def test_encode_png_is_lossless() -> None:
    image = Image.new("RGB", (32, 16), (1, 2, 3))
    decoded = Image.open(io.BytesIO(agent_mod.encode_image(image, "png", 75)))
    assert decoded.format == "PNG" and decoded.convert("RGB").getpixel((5, 5)) == (1, 2, 3)


# `cvt W H` of xcvt 0.1.2 (Debian 12), for sizes it does not round.
CVT = {
    (1920, 1080): "173.00 1920 2048 2248 2576 1080 1083 1088 1120",
    (2560, 1600): "348.50 2560 2760 3032 3504 1600 1603 1609 1658",
    (1280, 800): "83.50 1280 1352 1480 1680 800 803 809 831",
    (1024, 768): "63.50 1024 1072 1176 1328 768 771 775 798",
    (2048, 1152): "197.00 2048 2184 2400 2752 1152 1155 1160 1195",
    (1600, 900): "118.25 1600 1696 1856 2112 900 903 908 934",
    (800, 600): "38.25 800 832 912 1024 600 603 607 624",
    (1280, 720): "74.50 1280 1344 1472 1664 720 723 728 748",
}


@pytest.mark.parametrize(("size", "modeline"), sorted(CVT.items()))
def test_cvt_modeline_matches_cvt(size: tuple[int, int], modeline: str) -> None:
    assert agent_mod.cvt_modeline(*size) == [*modeline.split(), "-hsync", "+vsync"]


def test_cvt_modeline_keeps_an_odd_width_exact() -> None:
    line = agent_mod.cvt_modeline(1366, 768)
    clock, h, hs, he, ht, v, vs, ve, vt = line[:9]
    assert (int(h), int(v)) == (1366, 768)
    assert int(h) < int(hs) < int(he) < int(ht) and int(v) < int(vs) < int(ve) < int(vt)
    assert 60 < float(clock) < 100


@pytest.mark.skipif(shutil.which("cvt") is None, reason="no cvt (package xcvt) to compare with")
@pytest.mark.parametrize("size", [(1440, 900), (2560, 1440), (1680, 1050), (640, 480), (2400, 1600)])
def test_cvt_modeline_against_the_real_cvt(size: tuple[int, int]) -> None:
    out = subprocess.run(["cvt", *map(str, size)], capture_output=True, text=True, check=True).stdout
    fields = out.strip().splitlines()[-1].split()[2:]
    assert agent_mod.cvt_modeline(*size) == fields


# What `xrandr --query` printed in a desktop rig (bochs-display, modesetting),
# after set_display 2560x1600 had added a mode; plus a disconnected output.
XRANDR = """\
Screen 0: minimum 320 x 200, current 2560 x 1600, maximum 8192 x 8192
Virtual-1 connected primary 2560x1600+0+0 (normal left inverted right x axis y axis) 325mm x 203mm
   1280x800      74.99 +
   1920x1440     60.00  
   1920x1080     60.00    50.00  
   640x480       60.00    59.94  
   2560x1600     59.99* 
Virtual-2 disconnected (normal left inverted right x axis y axis)
   1024x768 (0x48) 65.000MHz
  2560x1600 (0x4a) 348.500MHz -HSync +VSync
"""  # noqa: W291


def test_parse_xrandr() -> None:
    info = agent_mod.parse_xrandr(XRANDR)
    assert (info["width"], info["height"], info["output"]) == (2560, 1600, "Virtual-1")
    assert [(m["width"], m["height"]) for m in info["modes"]] == [
        (1280, 800), (1920, 1440), (1920, 1080), (640, 480), (2560, 1600),
    ]  # fmt: skip
    current = [m for m in info["modes"] if m["current"]]
    preferred = [m for m in info["modes"] if m["preferred"]]
    assert [m["name"] for m in current] == ["2560x1600"] and [m["name"] for m in preferred] == ["1280x800"]
    assert (info["maxWidth"], info["maxHeight"]) == (2560, 1600)


def test_parse_xrandr_without_outputs() -> None:
    info = agent_mod.parse_xrandr("Screen 0: minimum 1 x 1, current 640 x 480, maximum 640 x 480\n")
    assert info["width"] == 640 and info["output"] is None and info["modes"] == []


def test_read_session_env(tmp_path: Path) -> None:
    f = tmp_path / "session.env"
    f.write_text(
        "# comment\n\nDISPLAY=:0\nexport XAUTHORITY='/var/run/lightdm/root/:0'\n"
        'XDG_SESSION_TYPE="x11"\nnot a line\n1BAD=x\n=x\n'
    )
    env = agent_mod.read_session_env(str(f), {})
    assert env == {"DISPLAY": ":0", "XAUTHORITY": "/var/run/lightdm/root/:0", "XDG_SESSION_TYPE": "x11"}
    # the agent's own environment wins for DISPLAY/XAUTHORITY (systemd's EnvironmentFile)
    env = agent_mod.read_session_env(str(f), {"DISPLAY": ":7", "HOME": "/x"})
    assert env["DISPLAY"] == ":7" and "HOME" not in env
    # no DISPLAY anywhere: no desktop
    f.write_text("XAUTHORITY=/x\n")
    assert agent_mod.read_session_env(str(f), {}) == {}
    assert agent_mod.read_session_env(str(tmp_path / "missing"), {}) == {}
    assert agent_mod.read_session_env("", {"DISPLAY": ":3"}) == {"DISPLAY": ":3"}


# The rich clipboard's choice of target: images, then a URI list, then text,
# among the kinds the host accepts; today's text order is kept.
FIREFOX_IMAGE = ["TIMESTAMP", "TARGETS", "MULTIPLE", "image/png", "image/jpeg", "image/bmp", "text/html"]
NAUTILUS_COPY = ["TARGETS", "MULTIPLE", "x-special/gnome-copied-files", "UTF8_STRING", "text/uri-list", "STRING"]


@pytest.mark.parametrize(
    ("offered", "accept", "expected"),
    [
        (FIREFOX_IMAGE, ("text",), []),  # today's behaviour: text only, and there is none
        (FIREFOX_IMAGE, ("image",), ["image/png", "image/jpeg"]),
        (FIREFOX_IMAGE, ("text", "image"), ["image/png", "image/jpeg"]),
        (["TARGETS", "image/jpeg", "UTF8_STRING"], ("text", "image"), ["image/jpeg", "UTF8_STRING"]),
        (["TARGETS", "image/jpeg", "UTF8_STRING"], ("text",), ["UTF8_STRING"]),
        (NAUTILUS_COPY, ("text",), ["UTF8_STRING", "STRING", "text/uri-list"]),  # as before the lanes
        (NAUTILUS_COPY, ("uris",), ["text/uri-list"]),
        (NAUTILUS_COPY, ("text", "uris"), ["text/uri-list", "UTF8_STRING", "STRING"]),
        (NAUTILUS_COPY, ("uris", "image", "text"), ["text/uri-list", "UTF8_STRING", "STRING"]),
        (["STRING", "TEXT", "text/plain", "text/plain;charset=utf-8"], ("text",),
         ["text/plain;charset=utf-8", "STRING", "TEXT", "text/plain"]),
        ([], ("text", "image"), []),
        # the owner did not answer TARGETS: the likely ones, best first
        (None, ("text",), ["UTF8_STRING", "text/plain;charset=utf-8", "STRING"]),
        (None, ("image", "uris", "text"), ["image/png", "image/jpeg", "text/uri-list", "UTF8_STRING",
                                           "text/plain;charset=utf-8", "STRING"]),
    ],
)  # fmt: skip
def test_pick_targets(offered: list[str] | None, accept: tuple[str, ...], expected: list[str]) -> None:
    assert agent_mod.pick_targets(offered, accept) == expected


def test_media_types_and_reported_targets() -> None:
    assert [agent_mod.media_type(t) for t in ("image/png", "image/jpeg", "text/uri-list", "UTF8_STRING", None)] == [
        "image/png", "image/jpeg", "text/uri-list", "text/plain", "text/plain",
    ]  # fmt: skip
    names = ["TARGETS", "", "x" * 129, "x" * 128] + [f"t{i}" for i in range(100)]
    reported = agent_mod.report_targets(names)
    assert reported[:2] == ["TARGETS", "x" * 128] and len(reported) == 64
    assert agent_mod.report_targets(None) == []


# --------------------------------------------------------------------------
# a terminal agent: protocol 1, no display


@pytest.fixture
def terminal() -> Iterator[AgentHarness]:
    harness = AgentHarness.stdio()
    try:
        ready = harness.wait_for(lambda e: isinstance(e, Ready))
        assert ready == Ready(1, "rigd-agent/1", harness.proc.pid, ("files",))
        yield harness
    finally:
        harness.close()
    assert harness.garbage() == []


@pytest.mark.timeout(20)
def test_terminal_agent_stays_protocol_1(terminal: AgentHarness) -> None:
    body = terminal.call("hello").body
    assert body["proto"] == 1 and body["agent"] == "rigd-agent/1"
    assert body["features"] == ["files"]  # protocol 1 says what it can do too (the lanes)
    assert "display" not in body and "displayReady" not in body


@pytest.mark.timeout(20)
@pytest.mark.parametrize(
    ("op", "fields"),
    [
        ("screen", {}),
        ("screenshot", {"format": "png"}),
        ("cursor", {}),
        ("display", {}),
        ("set_display", {"width": 1920, "height": 1080}),
        ("clipboard_read", {"selection": "primary"}),
        ("clipboard_write", {"text": "x"}),
        ("clipboard_read", {"accept": ["image", "uris", "text"]}),
        ("clipboard_write", {"data": "iVBORw==", "mediaType": "image/png"}),
        ("clipboard_write", {"text": "file:///a\r\n", "mediaType": "text/uri-list", "continues": True}),
        ("keymap_bind", {"bind": [[200, 0x20AC], [8, 0], [255, 0x1FFFFFF]]}),
    ],
)
def test_terminal_agent_answers_desktop_ops_with_no_display(
    terminal: AgentHarness, op: str, fields: dict[str, Any]
) -> None:
    reply = terminal.call(op, **fields)
    assert not reply.ok and reply.error == "no display: this rig has no X session"


@pytest.mark.timeout(20)
@pytest.mark.parametrize(
    ("op", "fields", "error"),
    [
        ("screen", {"maxWidth": 2561}, "maxWidth must be between 16 and 2560"),
        ("screen", {"maxHeight": 0}, "maxHeight must be between 16 and 1600"),
        ("screen", {"maxWidth": "1280"}, "maxWidth must be an integer"),
        ("screen", {"quality": 101}, "quality must be between 1 and 100"),
        ("screen", {"format": "gif"}, "format must be one of jpeg, png"),
        ("screen", {"markCursor": 1}, "markCursor must be a boolean"),
        ("set_display", {"width": 1920}, "height is required"),
        ("set_display", {"width": 2562, "height": 1600}, "width must be between 640 and 2560"),
        ("set_display", {"width": 1920, "height": 1601}, "height must be between 480 and 1600"),
        ("set_display", {"width": 639, "height": 480}, "width must be between 640 and 2560"),
        ("clipboard_read", {"selection": "secondary"}, "selection must be one of clipboard, primary, xdnd"),
        ("clipboard_write", {}, "text is required and must be a string"),
        ("clipboard_write", {"text": 5}, "text is required and must be a string"),
        ("clipboard_write", {"text": "x", "selection": "xdnd"}, "selection must be one of clipboard, primary"),
        ("clipboard_write", {"text": "x", "continues": "yes"}, "continues must be a boolean"),
        ("clipboard_read", {"accept": []}, "accept must be a non-empty list of text, image, uris"),
        ("clipboard_read", {"accept": "image"}, "accept must be a non-empty list of text, image, uris"),
        ("clipboard_read", {"accept": ["files"]}, "accept must be a non-empty list of text, image, uris"),
        ("clipboard_write", {"text": "x", "mediaType": "image/gif"},
         "mediaType must be one of text/plain, text/uri-list, image/png, image/jpeg"),
        ("clipboard_write", {"text": "x", "mediaType": "image/png"}, "text is not for image/png: send data"),
        ("clipboard_write", {"mediaType": "image/jpeg"}, "data is required and must be a base64 string"),
        ("clipboard_write", {"data": "!!", "mediaType": "image/png"}, "data is not valid base64"),
        ("clipboard_write", {"data": "A" * 700_000, "mediaType": "image/png"}, "data is over 524288 bytes in one part"),
        ("clipboard_write", {"data": "AAAA"}, "data is not for text/plain: send text"),
        ("clipboard_write", {"mediaType": "text/uri-list"}, "text is required and must be a string"),
        ("keymap_bind", {}, "bind must be a list of 1 to 32 [keycode, keysym] pairs"),
        ("keymap_bind", {"bind": []}, "bind must be a list of 1 to 32 [keycode, keysym] pairs"),
        ("keymap_bind", {"bind": [[200, 65]] * 33}, "bind must be a list of 1 to 32 [keycode, keysym] pairs"),
        ("keymap_bind", {"bind": [[200]]}, "bind[0] must be a [keycode, keysym] pair of integers"),
        ("keymap_bind", {"bind": [[200, 65], [200, "a"]]}, "bind[1] must be a [keycode, keysym] pair of integers"),
        ("keymap_bind", {"bind": [[200, True]]}, "bind[0] must be a [keycode, keysym] pair of integers"),
        ("keymap_bind", {"bind": [[7, 65]]}, "bind[0]: keycode must be between 8 and 255"),
        ("keymap_bind", {"bind": [[256, 65]]}, "bind[0]: keycode must be between 8 and 255"),
        ("keymap_bind", {"bind": [[200, -1]]}, "bind[0]: keysym must be between 0 and 0x1ffffff"),
        ("keymap_bind", {"bind": [[200, 0x2000000]]}, "bind[0]: keysym must be between 0 and 0x1ffffff"),
    ],
)  # fmt: skip
def test_desktop_op_fields_are_validated(
    terminal: AgentHarness, op: str, fields: dict[str, Any], error: str
) -> None:
    reply = terminal.call(op, **fields)
    assert not reply.ok and reply.error == f"bad request: {error}"


# --------------------------------------------------------------------------
# a desktop agent against Xvfb


def _have_x_tools() -> str | None:
    for tool in ("Xvfb", "xauth", "xrandr", "xclip", "xdotool"):
        if shutil.which(tool) is None:
            return f"no {tool} on this host"
    if not os.path.exists(SYSTEM_PYTHON):
        return "no /usr/bin/python3"
    probe = subprocess.run([SYSTEM_PYTHON, "-c", "import PIL.ImageGrab, Xlib.display"], capture_output=True)
    if probe.returncode != 0:
        return "the system python3 lacks python3-pil or python3-xlib"
    return None


X_MISSING = _have_x_tools()
needs_x = pytest.mark.skipif(X_MISSING is not None, reason=X_MISSING or "")


class Xvfb:
    def __init__(self, tmp: Path, width: int = 2560, height: int = 1600, *, auth: bool = True) -> None:
        """``auth=False``: no cookie, as a browser rig's engine display (local clients only)."""
        self.num = self._free_display()
        self.name = f":{self.num}"
        self.auth = tmp / "Xauthority"
        self.auth.touch(mode=0o600)
        subprocess.run(["xauth", "-f", str(self.auth), "add", self.name, ".", secrets.token_hex(16)], check=True)
        self.proc = subprocess.Popen(
            # -noreset: like a desktop session, where clients always hold the server
            ["Xvfb", self.name, "-screen", "0", f"{width}x{height}x24", "-nolisten", "tcp", "-noreset",
             *(("-auth", str(self.auth)) if auth else ())],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        deadline = time.monotonic() + 10
        while not self._up():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                pytest.skip(f"Xvfb {self.name} did not start")
            time.sleep(0.05)

    @staticmethod
    def _free_display() -> int:
        for num in range(150, 400):
            if not os.path.exists(f"/tmp/.X{num}-lock") and not os.path.exists(f"/tmp/.X11-unix/X{num}"):
                return num
        raise AssertionError("no free X display number")

    def _up(self) -> bool:
        with socket.socket(socket.AF_UNIX) as s:
            try:
                s.connect(f"/tmp/.X11-unix/X{self.num}")
            except OSError:
                return False
        return True

    @property
    def env(self) -> dict[str, str]:
        return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "DISPLAY": self.name, "XAUTHORITY": str(self.auth)}

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)  # by PID: exactly our Xvfb
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@pytest.fixture
def xvfb(tmp_path: Path) -> Iterator[Xvfb]:
    if X_MISSING is not None:
        pytest.skip(X_MISSING)
    server = Xvfb(tmp_path)
    try:
        yield server
    finally:
        server.stop()


def desktop_agent(xvfb: Xvfb, tmp_path: Path, *, own_env: bool = False) -> AgentHarness:
    """A --stdio agent run like the image's: the session from a file (or its own environment)."""
    session = tmp_path / "session.env"
    session.write_text(f"# the X session\nDISPLAY={xvfb.name}\nXAUTHORITY={xvfb.auth}\n")
    if own_env:
        return AgentHarness.stdio("--session-env", "", python=SYSTEM_PYTHON, env=xvfb.env)
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
    return AgentHarness.stdio("--session-env", str(session), python=SYSTEM_PYTHON, env=env)


@pytest.fixture
def desktop(xvfb: Xvfb, tmp_path: Path) -> Iterator[AgentHarness]:
    harness = desktop_agent(xvfb, tmp_path)
    try:
        ready = harness.wait_for(lambda e: isinstance(e, Ready))
        assert ready == Ready(2, "rigd-agent/2", harness.proc.pid, tuple(ALL_FEATURES))
        yield harness
    finally:
        harness.close()
    assert harness.garbage() == []


def call_ok(agent: AgentHarness, op: str, timeout: float = 30.0, **fields: Any) -> Reply:
    reply = agent.call(op, timeout=timeout, **fields)
    assert reply.ok, f"{op}: {reply.error}"
    return reply


def move_pointer(agent: AgentHarness, x: int, y: int) -> None:
    # exec gets the session's DISPLAY/XAUTHORITY without asking
    out = agent.exec(["xdotool", "mousemove", "--sync", str(x), str(y)], timeout=20)
    assert out.body["exitCode"] == 0, out.stderr


def decode(agent: AgentHarness, reply: Reply) -> Image.Image:
    if "data" in reply.body:
        data = base64.b64decode(reply.body["data"])
    else:
        streams = agent.streams(reply.id)
        assert len(streams) == reply.body["chunks"]
        data = b"".join(s.data for s in streams)
    assert len(data) == reply.body["bytes"]
    image = Image.open(io.BytesIO(data))
    image.load()
    return image


@needs_x
@pytest.mark.timeout(60)
def test_desktop_agent_says_protocol_2(desktop: AgentHarness, xvfb: Xvfb) -> None:
    body = call_ok(desktop, "hello").body
    assert body["proto"] == 2 and body["agent"] == "rigd-agent/2"
    assert body["features"] == ALL_FEATURES
    assert body["display"] == xvfb.name and body["displayReady"] is True


@needs_x
@pytest.mark.timeout(60)
def test_session_from_the_agents_own_environment(xvfb: Xvfb, tmp_path: Path) -> None:
    harness = desktop_agent(xvfb, tmp_path, own_env=True)
    try:
        ready = harness.wait_for(lambda e: isinstance(e, Ready))
        assert isinstance(ready, Ready) and ready.proto == 2
        assert call_ok(harness, "cursor").body["displayWidth"] == 2560
    finally:
        harness.close()


@needs_x
@pytest.mark.timeout(90)
def test_screen_is_scaled_marked_and_described(desktop: AgentHarness) -> None:
    assert call_ok(desktop, "set_display", width=1920, height=1080).body["changed"] is True
    move_pointer(desktop, 600, 300)
    reply = call_ok(desktop, "screen", maxWidth=1280, maxHeight=800)
    body = reply.body
    assert (body["displayWidth"], body["displayHeight"]) == (1920, 1080)
    assert (body["imageWidth"], body["imageHeight"], body["scale"]) == (1280, 720, 1.5)
    assert body["cursor"] == [600, 300] and body["cursorMarked"] is True and body["format"] == "jpeg"
    assert set(body["timings"]) == {"grabMs", "scaleMs", "encodeMs", "totalMs"}
    image = decode(desktop, reply)
    assert image.format == "JPEG" and image.size == (1280, 720)
    assert mark_pixels(image, 400, 200) > 30  # 600/1.5, 300/1.5

    plain = call_ok(desktop, "screenshot", markCursor=False)
    assert plain.body["cursorMarked"] is False and plain.body["cursor"] == [600, 300]
    assert mark_pixels(decode(desktop, plain), 400, 200) == 0


@needs_x
@pytest.mark.timeout(90)
def test_a_big_png_comes_as_data_chunks(desktop: AgentHarness) -> None:
    assert call_ok(desktop, "display").body["width"] == 2560
    # Noise on the root window: a PNG of it is megabytes, far over the inline limit.
    paint = (
        "import os, Xlib.display, Xlib.X\n"
        "d = Xlib.display.Display(); r = d.screen().root; gc = r.create_gc()\n"
        "for y in range(0, 700, 20):\n"
        "    r.put_image(gc, 0, y, 700, 20, Xlib.X.ZPixmap, 24, 0, os.urandom(700 * 20 * 4))\n"
        "d.sync()\n"
    )
    out = desktop.exec([SYSTEM_PYTHON, "-c", paint], timeout=20)
    assert out.body["exitCode"] == 0, out.stderr
    reply = call_ok(desktop, "screen", format="png", maxWidth=2560, maxHeight=1600, markCursor=False)
    body = reply.body
    assert "data" not in body and body["chunks"] > 1 and body["bytes"] > 512 * 1024
    image = decode(desktop, reply)
    assert image.format == "PNG" and image.size == (2560, 1600) and body["scale"] == 1.0


@pytest.mark.parametrize(("rects", "expected"), [
    ([], []),
    ([(0, 0, 10, 10), (0, 0, 10, 10), (2, 2, 3, 3)], [[0, 0, 10, 10]]),  # a duplicate and one inside
    ([(-5, -5, 10, 10), (1275, 795, 10, 10)], [[0, 0, 5, 5], [1275, 795, 5, 5]]),  # clipped
    ([(2000, 0, 10, 10), (0, 0, 0, 5)], []),  # off screen, empty
    ([(i * 20, 0, 10, 10) for i in range(17)], [[0, 0, 330, 10]]),  # over the limit: the bounding box
])
def test_coalesce_rects(rects: list[tuple[int, int, int, int]], expected: list[list[int]]) -> None:
    assert sorted(agent_mod.coalesce_rects(rects, 1280, 800)) == expected


@needs_x
@pytest.mark.timeout(60)
def test_damage_watch_tells_where_the_screen_changed_and_nothing_when_idle(desktop: AgentHarness) -> None:
    rid = desktop.send("damage_watch", maxRate=10)
    # The first notice may be the whole screen (the DAMAGE object starts out damaged on some servers).
    time.sleep(1.0)
    desktop.streams(rid)
    paint = (
        "import time, Xlib.display\n"
        "d = Xlib.display.Display(); r = d.screen().root; gc = r.create_gc(foreground=0xff00ff)\n"
        "for i in range(40):\n"
        "    r.fill_rectangle(gc, 100 + i, 50, 20, 30); d.sync(); time.sleep(0.02)\n"
    )
    t0 = time.monotonic()
    assert desktop.exec([SYSTEM_PYTHON, "-c", paint], timeout=20).body["exitCode"] == 0
    elapsed = time.monotonic() - t0
    desktop.wait_for(lambda e: isinstance(e, Stream) and e.id == rid, timeout=5)
    time.sleep(0.5)
    notices = [s.body["notice"] for s in desktop.streams(rid)]
    # 40 fills coalesced: at most maxRate a second (plus the one just taken)
    assert len(notices) <= 10 * elapsed + 2, notices
    for n in notices:
        assert (n.width, n.height) == (2560, 1600) and n.cursor is not None
        assert all(x >= 100 and x + w <= 160 and y == 50 and h == 30 for x, y, w, h in n.rects), n
    time.sleep(1.5)
    assert desktop.streams(rid) == []  # idle: nothing
    assert call_ok(desktop, "damage_stop", watch=rid).body == {"stopped": True}
    reply = desktop.reply(rid, timeout=5)
    assert reply.ok and reply.body["notices"] >= 1
    assert call_ok(desktop, "damage_stop", watch=rid).body == {"stopped": False}


@needs_x
@pytest.mark.timeout(60)
def test_damage_watch_rate_is_validated(desktop: AgentHarness) -> None:
    for rate in (0, 61, "30", True):
        reply = desktop.call("damage_watch", maxRate=rate)
        assert not reply.ok and "maxRate" in (reply.error or "")
    assert not desktop.call("damage_stop").ok


@needs_x
@pytest.mark.timeout(60)
def test_cursor_follows_the_pointer(desktop: AgentHarness) -> None:
    move_pointer(desktop, 123, 456)
    assert call_ok(desktop, "cursor").body == {"cursor": [123, 456], "displayWidth": 2560, "displayHeight": 1600}


@needs_x
@pytest.mark.timeout(90)
def test_display_and_set_display(desktop: AgentHarness) -> None:
    before = call_ok(desktop, "display").body
    assert (before["width"], before["height"]) == (2560, 1600) and before["output"]
    assert before["maxWidth"] == 2560 and before["maxHeight"] == 1600
    # a size the screen does not list yet: the agent makes the mode (CVT)
    body = call_ok(desktop, "set_display", width=1024, height=768).body
    assert (body["width"], body["height"], body["changed"]) == (1024, 768, True)
    assert {"width": 1024, "height": 768} in [{"width": m["width"], "height": m["height"]} for m in body["modes"]]
    assert call_ok(desktop, "cursor").body["displayWidth"] == 1024  # the X connection sees it too
    # the same size again changes nothing
    assert call_ok(desktop, "set_display", width=1024, height=768).body["changed"] is False
    # a size that exists by now is switched to without a new mode
    body = call_ok(desktop, "set_display", width=2560, height=1600).body
    assert (body["width"], body["height"], body["changed"]) == (2560, 1600, True)
    shot = call_ok(desktop, "screen").body
    assert (shot["imageWidth"], shot["imageHeight"], shot["scale"]) == (1280, 800, 2.0)


@needs_x
@pytest.mark.timeout(90)
def test_clipboard_round_trips(desktop: AgentHarness) -> None:
    for selection in ("clipboard", "primary"):
        reply = call_ok(desktop, "clipboard_write", text=f"{TEXT} ({selection})", selection=selection)
        assert reply.body == {"selection": selection, "bytes": len(f"{TEXT} ({selection})".encode()),
                              "pending": False, "mediaType": "text/plain"}  # fmt: skip
    for selection in ("clipboard", "primary"):
        body = call_ok(desktop, "clipboard_read", selection=selection).body
        assert body["text"] == f"{TEXT} ({selection})" and body["owner"] is True
        assert body["truncated"] is False and body["bytes"] == len(body["text"].encode())
    # the default selection is the clipboard
    assert call_ok(desktop, "clipboard_read").body["text"] == f"{TEXT} (clipboard)"
    # no drag in progress: nobody owns XdndSelection, and that is a normal, empty answer
    body = call_ok(desktop, "clipboard_read", selection="xdnd").body
    assert body == {"selection": "xdnd", "owner": False, "target": None, "bytes": 0, "truncated": False,
                    "text": "", "mediaType": "text/plain", "targets": []}  # fmt: skip
    # an empty text is a text
    call_ok(desktop, "clipboard_write", text="")
    assert call_ok(desktop, "clipboard_read").body["text"] == ""
    # what xclip serves, other X clients read too
    call_ok(desktop, "clipboard_write", text=TEXT)
    out = desktop.exec(["xclip", "-o", "-selection", "clipboard"], timeout=20)
    assert out.stdout.decode() == TEXT


@needs_x
@pytest.mark.timeout(120)
def test_a_mebibyte_of_clipboard_in_parts_and_back_in_chunks(desktop: AgentHarness) -> None:
    unit = "0123456789abcdéf"  # 17 bytes of UTF-8
    reps = ((1 << 20) - 6) // 17
    text = unit * reps + "x" * ((1 << 20) - 6 - 17 * reps) + "世界"  # exactly 1 MiB of UTF-8
    data = text.encode()
    assert len(data) == 1 << 20
    half = len(text) // 2
    first = call_ok(desktop, "clipboard_write", text=text[:half], continues=True).body
    assert first == {"selection": "clipboard", "bytes": len(text[:half].encode()), "pending": True,
                     "mediaType": "text/plain"}  # fmt: skip
    assert call_ok(desktop, "clipboard_write", text=text[half:]).body["bytes"] == 1 << 20
    reply = call_ok(desktop, "clipboard_read")
    body = reply.body
    assert "text" not in body and body["bytes"] == 1 << 20 and body["truncated"] is False
    streams = desktop.streams(reply.id)
    assert len(streams) == body["chunks"] and b"".join(s.data for s in streams) == data
    # one byte more is refused, and the held parts are dropped with it
    call_ok(desktop, "clipboard_write", text=text[:half], continues=True)
    call_ok(desktop, "clipboard_write", text=text[half:], continues=True)
    reply = desktop.call("clipboard_write", text="x")
    assert not reply.ok and reply.error == f"bad request: text is {(1 << 20) + 1} bytes of UTF-8, over the 1048576-byte limit"
    call_ok(desktop, "clipboard_write", text="after")
    assert call_ok(desktop, "clipboard_read").body["text"] == "after"


@needs_x
@pytest.mark.timeout(60)
def test_exec_and_ptys_reach_the_session(desktop: AgentHarness, xvfb: Xvfb) -> None:
    out = desktop.exec(["sh", "-c", 'echo "$DISPLAY|$XAUTHORITY"; xrandr --current | head -1'], timeout=20)
    first, second = out.stdout.decode().splitlines()[:2]
    assert first == f"{xvfb.name}|{xvfb.auth}"
    assert second.startswith("Screen 0:")
    # the request's env still wins
    out = desktop.exec(["sh", "-c", 'echo "$DISPLAY"'], env={"DISPLAY": ":999"})
    assert out.stdout == b":999\n"
    out = desktop.exec(["xdotool", "getmouselocation"], timeout=20)
    assert out.body["exitCode"] == 0 and out.stdout.startswith(b"x:")


@needs_x
@pytest.mark.timeout(60)
def test_a_display_that_is_not_up_yet(xvfb: Xvfb, tmp_path: Path) -> None:
    # The image's agent starts long before X: it is protocol 2 from the start,
    # says displayReady false, and the ops say "display not ready".
    session = tmp_path / "later.env"
    session.write_text(f"DISPLAY=:{xvfb.num + 1}\nXAUTHORITY={xvfb.auth}\n")
    harness = AgentHarness.stdio("--session-env", str(session), python=SYSTEM_PYTHON, env={"PATH": "/usr/bin:/bin"})
    try:
        ready = harness.wait_for(lambda e: isinstance(e, Ready))
        assert isinstance(ready, Ready) and ready.proto == 2
        assert call_ok(harness, "hello").body["displayReady"] is False
        for op in ("screen", "cursor", "display", "clipboard_read"):
            reply = harness.call(op, timeout=30)
            assert not reply.ok and reply.error is not None
            assert reply.error.startswith("display not ready"), (op, reply.error)
        assert call_ok(harness, "ping").ok
    finally:
        harness.close()


def test_agent_module_is_importable_without_pil_or_xlib() -> None:
    # The terminal tools disk's python has only the standard library.
    code = (
        "import sys, importlib.util\n"
        "sys.modules['PIL'] = None; sys.modules['Xlib'] = None\n"
        f"sys.path.insert(0, {str(agent_dir() / 'rigd_agent.pyz')!r})\n"
        "import rigd_agent.agent, rigd_agent.main, rigd_agent.mux\n"
        "from rigd_agent import base as m\n"
        "print(m.PROTO, m.PROTO_DESKTOP)\n"
    )
    out = subprocess.run([sys.executable, "-I", "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout == "1 2\n"


# An X client that owns CLIPBOARD and always answers UTF8_STRING by ICCCM
# INCR, 4000 bytes at a time (big transfers from browsers look like this).
INCR_OWNER = r"""
import sys, Xlib.display, Xlib.X, Xlib.Xatom
from Xlib.protocol import event
d = Xlib.display.Display()
w = d.screen().root.create_window(0, 0, 1, 1, 0, Xlib.X.CopyFromParent)
atom = d.intern_atom
SEL, INCR, UTF8, TARGETS = atom("CLIPBOARD"), atom("INCR"), atom("UTF8_STRING"), atom("TARGETS")
data = sys.stdin.buffer.read()
w.set_selection_owner(SEL, Xlib.X.CurrentTime)
d.sync()
print("owned", flush=True)

def notify(e, prop):
    e.requestor.send_event(event.SelectionNotify(time=e.time, requestor=e.requestor, selection=e.selection,
                                                 target=e.target, property=prop))
    d.flush()

while True:
    e = d.next_event()
    if e.type != Xlib.X.SelectionRequest:
        continue
    if e.target == TARGETS:
        e.requestor.change_property(e.property, Xlib.Xatom.ATOM, 32, [TARGETS, UTF8])
        notify(e, e.property)
    elif e.target == UTF8:
        req, prop = e.requestor, e.property
        req.change_attributes(event_mask=Xlib.X.PropertyChangeMask)
        req.change_property(prop, INCR, 32, [len(data)])
        notify(e, prop)
        off = 0
        while True:
            ev = d.next_event()
            if (ev.type == Xlib.X.PropertyNotify and ev.window.id == req.id and ev.atom == prop
                    and ev.state == Xlib.X.PropertyDelete):
                chunk = data[off:off + 4000]
                off += len(chunk)
                req.change_property(prop, UTF8, 8, chunk)
                d.flush()
                if not chunk:
                    break
    else:
        notify(e, Xlib.X.NONE)
"""


@needs_x
@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("text", "inline", "truncated"),
    [
        (TEXT * 500, True, False),  # 10 KB: INCR, but inline in the reply
        ("é" * 300_000, False, False),  # 600 KB of UTF-8, 1.8 MB as JSON escapes: data events
        ("x" * ((1 << 20) + 5000), False, True),  # over 1 MiB: cut at 1 MiB
    ],
)
def test_clipboard_read_follows_incr(
    desktop: AgentHarness, xvfb: Xvfb, text: str, inline: bool, truncated: bool
) -> None:
    owner = subprocess.Popen(
        [SYSTEM_PYTHON, "-I", "-c", INCR_OWNER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=xvfb.env
    )
    try:
        assert owner.stdin is not None and owner.stdout is not None
        owner.stdin.write(text.encode())
        owner.stdin.close()
        assert owner.stdout.readline() == b"owned\n"
        reply = call_ok(desktop, "clipboard_read")
        body = reply.body
        want = text.encode()[: 1 << 20]
        assert body["owner"] is True and body["target"] == "UTF8_STRING"
        assert body["truncated"] is truncated and body["bytes"] == len(want)
        if inline:
            assert body["text"] == text
        else:
            streams = desktop.streams(reply.id)
            assert "text" not in body and len(streams) == body["chunks"]
            assert b"".join(s.data for s in streams) == want
    finally:
        owner.kill()  # by PID: the owner started above
        owner.wait()
        if owner.stdout is not None:
            owner.stdout.close()


# --------------------------------------------------------------------------
# the lanes on a desktop agent: images and URI lists on the clipboard, keymap_bind


def png_bytes(width: int, height: int, noise: bool = False) -> bytes:
    if noise:
        image = Image.frombytes("RGB", (width, height), os.urandom(width * height * 3))
    else:
        image = Image.new("RGB", (width, height), (10, 200, 30))
    buf = io.BytesIO()
    image.save(buf, "PNG")
    return buf.getvalue()


@needs_x
@pytest.mark.timeout(90)
def test_clipboard_image_round_trip(desktop: AgentHarness) -> None:
    png = png_bytes(40, 30)
    body = call_ok(desktop, "clipboard_write", data=png, mediaType="image/png").body
    assert body == {"selection": "clipboard", "bytes": len(png), "pending": False, "mediaType": "image/png"}
    reply = call_ok(desktop, "clipboard_read", accept=["text", "image"])
    body = reply.body
    assert body["mediaType"] == "image/png" and body["target"] == "image/png" and body["owner"] is True
    assert "image/png" in body["targets"] and "text" not in body
    assert base64.b64decode(body["data"]) == png and body["bytes"] == len(png)
    # a host that accepts only text (today's clipboard_read) sees no text, and what is offered
    body = call_ok(desktop, "clipboard_read").body
    assert (body["target"], body["text"], body["mediaType"], body["bytes"]) == (None, "", "text/plain", 0)
    assert "image/png" in body["targets"]
    # other X clients get the image too
    out = desktop.exec(["xclip", "-o", "-selection", "clipboard", "-t", "image/png"], timeout=20)
    assert out.stdout == png


@needs_x
@pytest.mark.timeout(120)
def test_a_big_clipboard_image_in_parts_and_back_in_chunks(desktop: AgentHarness) -> None:
    jpeg_like = png_bytes(500, 500, noise=True)  # ~750 KB: two parts, streamed back
    assert len(jpeg_like) > 512 * 1024
    half = 512 * 1024
    first = call_ok(desktop, "clipboard_write", data=jpeg_like[:half], mediaType="image/jpeg", continues=True)
    assert first.body == {"selection": "clipboard", "bytes": half, "pending": True, "mediaType": "image/jpeg"}
    # another media type cannot continue those parts
    reply = desktop.call("clipboard_write", text="x", continues=True)
    assert not reply.ok and reply.error == (
        "bad request: mediaType text/plain does not continue the held image/jpeg parts: dropped"
    )
    call_ok(desktop, "clipboard_write", data=jpeg_like[:half], mediaType="image/jpeg", continues=True)
    call_ok(desktop, "clipboard_write", data=jpeg_like[half:], mediaType="image/jpeg")
    reply = call_ok(desktop, "clipboard_read", accept=["image"])
    body = reply.body
    assert body["mediaType"] == "image/jpeg" and "data" not in body and body["bytes"] == len(jpeg_like)
    streams = desktop.streams(reply.id)
    assert len(streams) == body["chunks"] and b"".join(s.data for s in streams) == jpeg_like


@needs_x
@pytest.mark.timeout(90)
def test_clipboard_uri_list_round_trip(desktop: AgentHarness) -> None:
    uris = "file:///root/drops/a.txt\r\nfile:///root/drops/2-a%20b.txt\r\n"
    body = call_ok(desktop, "clipboard_write", text=uris, mediaType="text/uri-list", selection="primary").body
    assert body["mediaType"] == "text/uri-list" and body["bytes"] == len(uris)
    body = call_ok(desktop, "clipboard_read", selection="primary", accept=["uris", "text"]).body
    assert (body["mediaType"], body["target"], body["text"]) == ("text/uri-list", "text/uri-list", uris)
    # asked for images only: nothing of that kind is offered
    body = call_ok(desktop, "clipboard_read", selection="primary", accept=["image"]).body
    assert (body["target"], body["text"], body["mediaType"]) == (None, "", "text/plain")
    assert body["targets"] == ["TARGETS", "text/uri-list"]


KEYMAP_OF = (
    "import sys, Xlib.display\n"
    "d = Xlib.display.Display()\n"
    "for kc in map(int, sys.argv[1:]):\n"
    "    print(kc, *d.get_keyboard_mapping(kc, 1)[0])\n"
)


@needs_x
@pytest.mark.timeout(60)
def test_keymap_bind_sets_every_column(desktop: AgentHarness) -> None:
    body = call_ok(desktop, "keymap_bind", bind=[[200, 0x20AC], [201, 0x1000416], [202, 0]]).body
    per = body["keysymsPerKeycode"]
    assert body["bound"] == 3 and per >= 2
    # what any other client of the X server sees now
    out = desktop.exec([SYSTEM_PYTHON, "-c", KEYMAP_OF, "200", "201", "202"], timeout=20)
    assert out.body["exitCode"] == 0, out.stderr
    rows = {int(kc): [int(k) for k in ks] for kc, *ks in (ln.split() for ln in out.stdout.decode().splitlines())}
    # Unshifted and shifted alike (the first two columns, group 1). The server's
    # XKB keeps the columns it maps to groups and levels and may zero the rest.
    assert rows[200][:2] == [0x20AC, 0x20AC] and set(rows[200]) <= {0x20AC, 0}
    assert rows[201][:2] == [0x1000416, 0x1000416] and set(rows[201]) <= {0x1000416, 0}
    assert set(rows[202]) == {0}
    # binding again rebinds
    call_ok(desktop, "keymap_bind", bind=[[200, 0x61]])
    out = desktop.exec([SYSTEM_PYTHON, "-c", KEYMAP_OF, "200"], timeout=20)
    assert [int(k) for k in out.stdout.decode().split()[1:3]] == [0x61, 0x61]


#: Paints the root window of $DISPLAY with a pattern only its own coordinates make (red x,
#: green y, blue x+y, each mod 256), then holds the display until stdin closes.
PAINT = """
import sys, Xlib.display, Xlib.X
d = Xlib.display.Display()
root = d.screen().root
g = root.get_geometry()
gc = root.create_gc()
for top in range(0, g.height, 16):
    rows = min(16, g.height - top)
    data = bytes(b for y in range(top, top + rows) for x in range(g.width)
                 for b in ((x + y) % 256, y % 256, x % 256, 0))
    root.put_image(gc, 0, top, g.width, rows, Xlib.X.ZPixmap, 24, 0, data)
d.sync()
print("painted", flush=True)
sys.stdin.read()
"""


def pattern(x0: int, y0: int, w: int, h: int) -> bytes:
    return bytes(b for y in range(y0, y0 + h) for x in range(x0, x0 + w) for b in (x % 256, y % 256, (x + y) % 256))


@needs_x
@pytest.mark.timeout(90)
def test_an_agent_without_a_session_grabs_a_display_of_the_rigs_own_cropped(tmp_path: Path) -> None:
    """A browser rig's agent (protocol 1, the tools disk's interpreter: no site packages) grabs
    its engine's display (``screen {display, rect}``) with the image's Pillow, cropped to the
    page before scaling: every pixel is the one at that place on the screen."""
    xvfb = Xvfb(tmp_path, 1024, 768, auth=False)
    painter = subprocess.Popen([SYSTEM_PYTHON, "-c", PAINT], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                               env={"PATH": "/usr/bin:/bin", "DISPLAY": xvfb.name})
    harness = AgentHarness.stdio(python=SYSTEM_PYTHON, flags=("-I", "-S"))
    try:
        assert painter.stdout is not None and painter.stdout.readline() == b"painted\n"
        ready = harness.wait_for(lambda e: isinstance(e, Ready))
        assert isinstance(ready, Ready) and ready.proto == 1
        reply = call_ok(harness, "screen", display=xvfb.name, rect=[100, 50, 320, 200], format="png",
                        markCursor=False)
        body = reply.body
        assert (body["displayWidth"], body["displayHeight"], body["imageWidth"], body["imageHeight"]) == \
            (320, 200, 320, 200)
        image = decode(harness, reply)
        assert image.mode == "RGB" and image.tobytes() == pattern(100, 50, 320, 200)
        # Scaled after the crop: a 640x400 page as a 320x200 still, scale 2.
        scaled = call_ok(harness, "screen", display=xvfb.name, rect=[0, 0, 640, 400], maxWidth=320,
                         maxHeight=200).body
        assert (scaled["imageWidth"], scaled["imageHeight"], scaled["scale"]) == (320, 200, 2.0)
        # Still protocol 1: the session's own ops say so; a rect off the screen is refused.
        assert harness.call("cursor").error == "no display: this rig has no X session"
        off = harness.call("screen", display=xvfb.name, rect=[900, 0, 320, 200])
        assert not off.ok and off.error == "rect [900, 0, 320, 200] is outside the 1024x768 screen"
        for fields, error in (({"display": "elsewhere:0"}, "display must be a local X display such as :99"),
                              ({"display": 99}, "display must be a local X display such as :99"),
                              ({"rect": [0, 0, 0, 10]}, "rect: x and y must be 0 to 16383, width and height "
                                                        "1 to 16384"),
                              ({"rect": [0, 0, 10]}, "rect must be [x, y, width, height], four integers"),
                              ({"rect": [0, 0, 10, True]}, "rect must be [x, y, width, height], four integers")):
            got = harness.call("screen", **fields)
            assert not got.ok and got.error == f"bad request: {error}", (fields, got.error)
    finally:
        harness.close()
        painter.communicate(timeout=10)  # its stdin closed: it ends; its pipes closed
        xvfb.stop()
    assert harness.garbage() == []
