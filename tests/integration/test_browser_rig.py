"""A real Chromium browser rig under TCG, through the server: ``rig.open {surface: browser}``,
``rig.act browser_use``, ``tools.call browser_use`` and the rig's failure boundary.

One server and one rig for the module (a cold browser boots in ~1 min under TCG); the
tests run in file order and the last one kills the engine. Pages come from a tiny HTTP
server the tests start inside the guest on its loopback (socat, in the image), so no
test traffic leaves the machine and the rig's egress stays empty. What the page did is
read back through ``extract`` and through the guest (``terminal_use exec``).
"""

from __future__ import annotations

import base64
import io
import json
import shlex
import shutil
import time
from collections.abc import Iterator
from typing import Any

import pytest
from PIL import Image
from websockets.sync.client import connect

from rigd.images.browser import Engine, build_browser
from tests.integration.conftest import Server, make_data_dir, serving

pytestmark = [
    pytest.mark.vm,
    pytest.mark.timeout(900),
    pytest.mark.skipif(shutil.which("qemu-system-x86_64") is None, reason="needs QEMU"),
]

#: A one-file HTTP/1.0 server for /srv, run by socat for each connection.
HANDLER = r"""#!/bin/sh
read -r method path proto
while read -r line; do [ "$(printf %s "$line" | tr -d '\r')" = "" ] && break; done
f="/srv${path%%\?*}"
if [ -f "$f" ]; then
  printf 'HTTP/1.0 200 OK\r\nContent-Type: text/html; charset=utf-8\r\nContent-Length: %s\r\n\r\n' "$(wc -c <"$f")"
  cat "$f"
else
  printf 'HTTP/1.0 404 Not Found\r\nContent-Length: 0\r\n\r\n'
fi
"""

FORM = """<!doctype html><html><head><meta charset="utf-8"><title>Form</title></head><body>
<input id="name" autofocus><textarea id="notes"></textarea>
<button id="go" onclick="document.getElementById('out').textContent = 'hello ' +
  document.getElementById('name').value; console.log('clicked', document.getElementById('name').value)">Go</button>
<p id="out">nothing yet</p><a id="next" href="/second.html">next</a>
<div style="height: 3000px">tall</div>
<script>console.log('form loaded'); document.getElementById('notes').addEventListener('keydown',
  e => { if (e.key === 'Enter') document.title = 'enter pressed'; });
setTimeout(() => { const d = document.createElement('div'); d.id = 'late'; document.body.appendChild(d); }, 1500);
</script></body></html>"""

SECOND = """<!doctype html><html><head><meta charset="utf-8"><title>Second</title></head>
<body><h1>second page</h1></body></html>"""

PERSON = """<!doctype html><html><head><meta charset="utf-8"><title>Person</title></head><body>
<button id="big" style="position: fixed; left: 0; top: 0; width: 400px; height: 200px"
  onclick="document.body.style.background = 'rgb(255, 0, 0)'; document.getElementById('box').focus()">press</button>
<input id="box" style="position: fixed; left: 0; top: 300px"
  onkeydown="if (event.key === 'Enter') document.title = 'typed ' + this.value">
</body></html>"""

SITE = "http://127.0.0.1:8000"


def sh(srv: Server, rig: str, command: str, timeout_s: float = 60) -> str:
    out = srv.call("rig.act", {"rigId": rig, "tool": "terminal_use",
                               "action": {"action": "exec", "command": command, "timeoutS": timeout_s}})
    assert out["exitCode"] == 0, out
    return str(out["stdout"]["text"])


def act(srv: Server, rig: str, **action: Any) -> dict[str, Any]:
    return dict(srv.call("rig.act", {"rigId": rig, "tool": "browser_use", "action": action}))


def refused(srv: Server, rig: str, **action: Any) -> dict[str, Any]:
    return srv.error("rig.act", {"rigId": rig, "tool": "browser_use", "action": action})


@pytest.fixture(scope="module")
def browser() -> Iterator[tuple[Server, str]]:
    build_browser(Engine.CHROMIUM, log=lambda m: print(f"[images] {m}"))  # cached: a hash
    with serving(make_data_dir()) as srv:
        t0 = time.monotonic()
        rig = srv.call("rig.open", {"workspace": "default", "surface": "browser", "conversation": "c1"})
        print(f"browser rig ready in {time.monotonic() - t0:.1f} s")
        assert rig["phase"] == "ready", rig
        files = {"handler.sh": HANDLER, "form.html": FORM, "second.html": SECOND, "person.html": PERSON}
        script = "mkdir -p /srv && " + " && ".join(
            f"printf '%s' {shlex.quote(body)} > /srv/{name}" for name, body in files.items())
        sh(srv, rig["id"], script + " && chmod 0755 /srv/handler.sh")
        sh(srv, rig["id"], "setsid socat TCP-LISTEN:8000,bind=127.0.0.1,reuseaddr,fork "
                           "EXEC:/srv/handler.sh </dev/null >/dev/null 2>&1 & "
                           "until curl -sf -o /dev/null http://127.0.0.1:8000/second.html; do sleep 0.1; done")
        yield srv, rig["id"]


def test_a_browser_rig_is_one_engine_reused_by_its_conversation(browser: tuple[Server, str]) -> None:
    srv, rig = browser
    got = srv.call("rig.get", {"rigId": rig})
    assert (got["surface"], got["engine"], got["backend"]) == ("browser", "chromium", "smolvm")
    assert got["display"] == {"width": 1280, "height": 800} and got["memoryMb"] == 2048
    assert got["image"].startswith("sha256:")
    # The same conversation and engine: the same rig, not a second machine.
    again = srv.call("rig.open", {"workspace": "default", "surface": "browser", "conversation": "c1",
                                  "engine": "chromium"})
    assert again["id"] == rig
    # An engine this build does not start is refused naming the field, never replaced by the default.
    for engine, fragment in (("firefox", "not available in this build"), ("edge", "unknown engine")):
        err = srv.error("rig.open", {"workspace": "default", "surface": "browser", "conversation": "c1",
                                     "engine": engine})
        assert err["data"]["field"] == "engine" and fragment in err["message"], err
    # The engine runs as the unprivileged browser user, and its DevTools listen on guest loopback only.
    assert sh(srv, rig, "ps -o user= -p $(cat /run/rigd-browser.pid)").strip() == "browser"
    listening = sh(srv, rig, "cat /proc/net/tcp")
    assert ":2407" in listening and ":2406" in listening  # 9223, 9222 in hex
    for line in listening.splitlines()[1:]:
        local, state = line.split()[1], line.split()[3]
        if state == "0A" and local.endswith((":2407", ":2406")):
            assert local.startswith("0100007F:"), line  # 127.0.0.1


def test_the_start_page_is_a_local_document(browser: tuple[Server, str]) -> None:
    srv, rig = browser
    dom = act(srv, rig, action="extract", kind="dom")
    assert dom["url"].startswith("file:///tmp/rigd-profile.")
    assert "rigd browser rig" in dom["content"]["text"] and dom["content"]["untrusted"] is True


def test_navigate_fill_click_and_read_back(browser: tuple[Server, str]) -> None:
    srv, rig = browser
    nav = act(srv, rig, action="navigate", url=f"{SITE}/form.html")
    assert nav["url"] == f"{SITE}/form.html", nav
    act(srv, rig, action="fill", selector="#name", text="Zoë 世界")
    act(srv, rig, action="click", selector="#go")
    dom = act(srv, rig, action="extract", kind="dom")
    assert "hello Zoë 世界" in dom["content"]["text"], dom["content"]["text"][:2000]
    console = act(srv, rig, action="extract", kind="console")
    assert "form loaded" in console["content"]["text"] and "clicked" in console["content"]["text"]


def test_type_and_key_reach_the_focused_element(browser: tuple[Server, str]) -> None:
    srv, rig = browser
    act(srv, rig, action="click", selector="#notes")
    act(srv, rig, action="type", text="línea")
    act(srv, rig, action="key", text="Enter")
    dom = act(srv, rig, action="extract", kind="dom")
    assert dom["title"]["text"] == "enter pressed", dom["title"]


def test_screenshot_and_viewport(browser: tuple[Server, str]) -> None:
    srv, rig = browser
    shot = act(srv, rig, action="screenshot")
    img = Image.open(io.BytesIO(base64.b64decode(shot["image"]["data"])))
    assert img.format == "JPEG" and img.size == (1280, 800) == (shot["imageSize"]["width"],
                                                                 shot["imageSize"]["height"])
    act(srv, rig, action="set_viewport", width=800, height=600)
    shot = act(srv, rig, action="screenshot")
    assert shot["display"] == {"width": 800, "height": 600} and shot["imageSize"] == {"width": 800, "height": 600}
    full = act(srv, rig, action="screenshot", full_page=True)
    assert full["fullPage"] is True and full["pageSize"]["height"] > 3000
    act(srv, rig, action="set_viewport", width=1280, height=800)


def test_wait_for_history_and_scroll(browser: tuple[Server, str]) -> None:
    srv, rig = browser
    act(srv, rig, action="reload")
    found = act(srv, rig, action="wait_for", selector="#late", timeoutS=10)
    assert found["found"] is True
    missing = act(srv, rig, action="wait_for", selector="#never", timeoutS=0.5)
    assert missing["found"] is False and "no element" in missing["note"]
    act(srv, rig, action="scroll", scroll_direction="down", scroll_amount=5)
    act(srv, rig, action="click", selector="#next")
    found = act(srv, rig, action="wait_for", selector="h1", timeoutS=10)
    assert found["found"] is True
    back = act(srv, rig, action="history", direction="back")
    assert back["url"] == f"{SITE}/form.html", back


def test_bad_input_is_a_field_error_and_the_page_is_untouched(browser: tuple[Server, str]) -> None:
    srv, rig = browser
    before = act(srv, rig, action="extract", kind="dom")["url"]
    for action, field in (
        ({"action": "navigate", "url": "file:///etc/passwd"}, "action.url"),
        ({"action": "navigate", "url": "javascript:alert(1)"}, "action.url"),
        ({"action": "navigate", "url": "data:text/html,hi"}, "action.url"),
        ({"action": "set_viewport", "width": 100, "height": 100}, "action.width"),
        ({"action": "wait_for", "selector": "p", "timeoutS": 60}, "action.timeoutS"),
    ):
        err = refused(srv, rig, **action)
        assert err["data"]["field"] == field, (action, err)
    err = refused(srv, rig, action="click", selector="p[")
    assert "selector" in err["message"], err
    # The clipboard has no API on plain http://: refused, saying why.
    err = refused(srv, rig, action="clipboard_read")
    assert "http://" in err["message"] and "type" in err["message"], err
    assert act(srv, rig, action="extract", kind="dom")["url"] == before


def test_tools_call_browser_use_returns_an_image(browser: tuple[Server, str]) -> None:
    srv, _rig = browser
    listed = srv.call("tools.list", {})
    assert "browser_use" in [t["function"]["name"] for t in listed["tools"]]
    out = srv.call("tools.call", {"workspace": "default", "conversation": "c1", "name": "browser_use",
                                  "arguments": {"action": "screenshot"}})
    assert out["isError"] is False and out["rigId"] == _rig
    assert out["content"][0]["type"] == "image" and out["content"][0]["mimeType"] == "image/jpeg"
    text = srv.call("tools.call", {"workspace": "default", "conversation": "c1", "name": "browser_use",
                                   "arguments": {"action": "extract", "kind": "dom"}})
    assert "<untrusted" in text["content"][0]["text"] or "untrusted" in text["content"][0]["text"]
    bad = srv.call("tools.call", {"workspace": "default", "conversation": "c1", "name": "browser_use",
                                  "arguments": {"action": "navigate", "url": "file:///"}})
    assert bad["isError"] is True and "url" in bad["content"][0]["text"]


def _recv(ws: Any, want: str, within_s: float = 60) -> dict[str, Any]:
    end = time.monotonic() + within_s
    while True:
        msg = ws.recv(timeout=max(0.1, end - time.monotonic()))
        if isinstance(msg, str):
            doc = json.loads(msg)
            assert doc.get("type") != "error", doc
            if doc.get("type") == want:
                return dict(doc)


def test_a_person_drives_the_page_through_the_live_view(browser: tuple[Server, str]) -> None:
    srv, rig = browser
    act(srv, rig, action="navigate", url=f"{SITE}/person.html")
    srv.call("rig.control", {"rigId": rig, "op": "take"})
    try:
        path = srv.call("rig.viewUrl", {"rigId": rig})["path"]
        with connect(srv.url.replace("http://", "ws://") + path, max_size=None, open_timeout=60) as ws:
            hello = _recv(ws, "hello")
            assert hello["control"] is True and hello["display"] == {"width": 1280, "height": 800}
            first = _recv(ws, "frame")
            # Chromium pushes the frames: the screencast, not polled screenshots.
            assert first["source"] == "cdp-screencast" and first["mediaType"] == "image/jpeg", first
            for msg in ({"type": "button", "button": "left", "down": True, "x": 100, "y": 100},
                        {"type": "button", "button": "left", "down": False, "x": 100, "y": 100},
                        {"type": "text", "text": "Grüße"},
                        {"type": "key", "key": "Return", "down": True},
                        {"type": "key", "key": "Return", "down": False}):
                ws.send(json.dumps(msg))
            ws.send(json.dumps({"type": "ping"}))
            _recv(ws, "pong")
            # The repaint (the body turned red) arrives as a new pushed frame.
            end = time.monotonic() + 60
            while True:
                frame = _recv(ws, "frame")
                image = ws.recv(timeout=30)
                assert isinstance(image, bytes)
                with Image.open(io.BytesIO(image)) as img:
                    red, green, _blue = img.convert("RGB").getpixel((900, 600))
                if red > 200 > green + 150:
                    break
                assert time.monotonic() < end, "no frame showed the click's repaint"
            assert frame["seq"] > first["seq"]
        dom = act(srv, rig, action="extract", kind="dom")
        assert dom["title"]["text"] == "typed Grüße", dom["title"]
        inputs = [r for r in srv.call("rig.log", {"rigId": rig}) if r["tool"] == "live_view"]
        assert [r["verb"] for r in inputs][-5:] == ["button", "button", "text", "key", "key"]
        assert "Grüße" not in json.dumps(inputs)  # typed text is masked in the audit log
    finally:
        srv.call("rig.control", {"rigId": rig, "op": "release"})
    # The agent continues from the page the person left.
    assert act(srv, rig, action="extract", kind="dom")["url"] == f"{SITE}/person.html"


def test_an_engine_that_exits_fails_the_rig_saying_so(browser: tuple[Server, str]) -> None:
    srv, rig = browser
    sh(srv, rig, "kill -KILL $(cat /run/rigd-browser.pid)")
    deadline = time.monotonic() + 120
    while True:
        got = srv.call("rig.get", {"rigId": rig})
        if got["phase"] == "failed":
            break
        assert time.monotonic() < deadline, got
        time.sleep(0.5)
    assert got["failure"].startswith("chromium: the browser exited"), got["failure"]
    # A conversation's next open is a fresh machine, never the dead engine silently restarted.
    err = srv.error("rig.act", {"rigId": rig, "tool": "browser_use", "action": {"action": "screenshot"}})
    assert "failed" in err["message"] or err["data"].get("phase") == "failed", err
