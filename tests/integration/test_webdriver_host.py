"""The WebKit driver and the WebDriver client against the host's real WebKitGTK.

No VM: the same engine and client a WebKit rig runs, on the host, so every
verb's meaning (and every stated limit) is checked against a real WebKit in
seconds. The fixture starts an Xvfb display and ``WebKitWebDriver`` in one
process group (killed by pid at teardown); each test's session launches
MiniBrowser. Pages come from the HTTP server of ``test_cdp_host`` (the same
pages the Chromium and Firefox drivers are held to).
"""

from __future__ import annotations

import base64
import io
import os
import signal
import subprocess
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import trio
from PIL import Image

from rigd.browser.live_input import PointerState
from rigd.browser.testing import WEBKIT_DRIVER, HostChromium, start_host_webkit, stop_host_chromium
from rigd.browser.webdriver import WebDriverConnection
from rigd.browser.webkit import (
    CONSOLE_LIMIT,
    NO_HARD_RELOAD,
    SCRIPT_SCROLL,
    STITCHED,
    WebKitDriver,
    open_webkit,
)
from rigd.errors import Conflict, FieldError
from rigd.model import Surface
from rigd.protocols.cdp import CDPClosed, CDPCommandFailed, CDPTimeout
from rigd.server.live import plan_input
from rigd.verbs import parse_action
from rigd.verbs.base import ParseContext
from tests.integration import test_cdp_host

pytestmark = pytest.mark.skipif(not Path(WEBKIT_DRIVER).exists(), reason="no WebKitWebDriver on this host")


@pytest.fixture(scope="module")
def webkit(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HostChromium]:
    home = tmp_path_factory.mktemp("webkit")
    try:
        host = start_host_webkit(home)
    except RuntimeError as exc:
        pytest.fail(str(exc))
    try:
        yield host
    finally:
        stop_host_chromium(host)


site = test_cdp_host.site
tls_site = test_cdp_host.tls_site


async def _connect(base: str) -> WebDriverConnection:
    authority = base.removeprefix("http://")
    host, _, port = authority.partition(":")
    stream = await trio.open_tcp_stream(host, int(port))
    return WebDriverConnection(stream, host=authority)


def x_clipboard(home: Path) -> Callable[[str | None], Awaitable[str]]:
    """The host display's X clipboard, as a rig's driver reaches its guest's (xclip)."""

    async def clip(text: str | None) -> str:
        env = {"PATH": "/usr/bin:/bin", "DISPLAY": ":" + (home / "display").read_text().strip()}
        if text is None:
            got = await trio.run_process(["xclip", "-selection", "clipboard", "-o", "-t", "UTF8_STRING"],
                                         capture_stdout=True, stderr=subprocess.DEVNULL, check=False, env=env)
            return got.stdout.decode("utf-8", "replace")
        await trio.run_process(["xclip", "-selection", "clipboard", "-i"], stdin=text.encode(),
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
        # xclip forks before its child owns the selection: the text is there once it reads back.
        with trio.fail_after(10):
            while await clip(None) != text:
                await trio.sleep(0.05)
        return text

    return clip


#: The host's MiniBrowser launch has hung under CI's load (stops 36 and 39: ``POST /session``
#: never answered, the test's deadline passed): the session is bounded so the fixture can
#: say so, with the driver's log, and start the host's WebKit afresh once.
HOST_SESSION_S = 40.0


@pytest.fixture
async def driver(webkit: HostChromium) -> AsyncIterator[WebKitDriver]:
    home = Path(webkit.log.name).parent
    for attempt in (1, 2):
        conn = await _connect(webkit.ws_url)
        opened = False
        try:
            async with open_webkit(conn, insecure_certs=True, clipboard=x_clipboard(home),
                                   session_timeout_s=HOST_SESSION_S) as d:
                opened = True
                yield d
            return
        except CDPTimeout as exc:
            if opened or attempt == 2 or "POST /session" not in str(exc):
                raise
            webkit.log.flush()
            tail = (home / "webkit.log").read_text(errors="replace")[-2000:]
            print(f"host WebKit: {exc}; its log ends:\n{tail}\nstarting it afresh")
            stop_host_chromium(webkit)
            fresh = await trio.to_thread.run_sync(start_host_webkit, home)
            webkit.ws_url, webkit.proc, webkit.log = fresh.ws_url, fresh.proc, fresh.log
        finally:
            await conn.aclose()


async def act(d: WebKitDriver, **payload: Any) -> dict[str, Any]:
    action = parse_action("browser_use", payload, ParseContext(d.viewport, Surface.BROWSER))
    if isinstance(action, FieldError):
        raise action
    with trio.fail_after(60):
        return await d.perform(action)


async def page(d: WebKitDriver, expression: str) -> Any:
    return await d._script(f"() => ({expression})")


@pytest.mark.timeout(120)
async def test_navigate_and_click_by_selector_and_coordinates(driver: WebKitDriver, site: str) -> None:
    assert driver.version.split(".")[0].isdigit()
    out = await act(driver, action="navigate", url=f"{site}/button.html")
    assert out["loaded"] is True and out["status"] is None and "HTTP status" in out["note"]
    assert out["url"] == f"{site}/button.html" and out["title"]["untrusted"] is True
    assert await page(driver, "[innerWidth, innerHeight]") == [1280, 800]
    clicked = await act(driver, action="click", selector="#b")
    assert clicked["coordinate"] == [200, 125]
    assert await page(driver, "document.title") == "b clicked"
    await act(driver, action="click", coordinate=[150, 320])
    assert await page(driver, "document.title") == "c clicked"
    for selector, want in (("text=B", "b"), ("//button[@id='c']", "c"), ('"B"', "b")):
        await act(driver, action="click", selector=selector)
        assert await page(driver, "document.title") == f"{want} clicked"
    fragment = await act(driver, action="navigate", url=f"{site}/button.html#part")
    assert "same-document" in fragment["note"]
    with pytest.raises(Exception, match="did not load"):
        await act(driver, action="navigate", url="http://127.0.0.1:1/")


@pytest.mark.timeout(120)
async def test_fill_submit_history_and_keys(driver: WebKitDriver, site: str) -> None:
    await act(driver, action="navigate", url=f"{site}/form.html")
    assert await act(driver, action="fill", selector="#q", text="rigs and WebKit") == {
        "selector": "#q", "characters": 15}
    await act(driver, action="click", selector="#go")
    await act(driver, action="wait_for", selector="#out", timeoutS=10)
    assert await page(driver, "document.title") == "result: rigs and WebKit"
    back = await act(driver, action="history", direction="back")
    assert back["url"] == f"{site}/form.html" and back["loaded"] is True
    forward = await act(driver, action="history", direction="forward")
    assert forward["url"].startswith(f"{site}/result.html?q=")
    with pytest.raises(FieldError, match="no later page") as info:
        await act(driver, action="history", direction="forward")
    assert info.value.field == "action.direction"
    await act(driver, action="navigate", url=f"{site}/input.html")
    await act(driver, action="click", selector="#t")
    typed = await act(driver, action="type", text="héllo 世界 e\u0301 👩‍👩‍👧")
    assert typed["focusedEditable"] is True
    assert await page(driver, "document.getElementById('t').value") == "héllo 世界 e\u0301 👩‍👩‍👧"
    await act(driver, action="key", text="Control+a")
    await act(driver, action="key", text="Backspace")
    await act(driver, action="key", text="Shift+KeyX")
    await act(driver, action="key", text="!")
    assert await page(driver, "document.getElementById('t').value") == "X!"


@pytest.mark.timeout(120)
async def test_extracts_console_dom_and_a_labelled_a11y(driver: WebKitDriver, site: str) -> None:
    await act(driver, action="navigate", url=f"{site}/console.html")
    await page(driver, "(console.log('after load', 7), console.warn('careful now'), 1)")
    console = await act(driver, action="extract", kind="console")
    text = console["content"]["text"]
    assert console["content"]["untrusted"] is True and console["note"].startswith(CONSOLE_LIMIT)
    assert "[log] after load 7" in text and "[warn] careful now" in text
    assert "hello from the page 42" not in text  # logged while it loaded: the stated limit
    assert (await act(driver, action="extract", kind="console"))["entries"] == 0
    dom = await act(driver, action="extract", kind="dom")
    assert "<h1>Console page</h1>" in dom["content"]["text"]
    await act(driver, action="navigate", url=f"{site}/a11y.html")
    a11y = await act(driver, action="extract", kind="a11y")
    tree = a11y["content"]["text"]
    assert a11y["source"] == WebKitDriver.A11Y_SOURCE and "DOM-derived" in a11y["source"]
    assert 'heading "Welcome home"' in tree
    assert 'button "Close dialog"' in tree and 'link "Search form"' in tree


@pytest.mark.timeout(120)
async def test_screenshots_scroll_viewport_and_wait_for(driver: WebKitDriver, site: str) -> None:
    await act(driver, action="navigate", url=f"{site}/tall.html")
    shot = await act(driver, action="screenshot")
    image = Image.open(io.BytesIO(base64.b64decode(shot["image"]["data"])))
    assert image.format == "JPEG" and image.size == (1280, 800) and shot["source"] == "webdriver"
    await page(driver, "(window.scrollTo(0, 120), 1)")
    full = await act(driver, action="screenshot", full_page=True)
    assert full["fullPage"] is True and STITCHED in full["note"] and full["pageSize"]["height"] == 3000
    image = Image.open(io.BytesIO(base64.b64decode(full["image"]["data"])))
    assert image.size == (1280, 3000)
    top, bottom = image.getpixel((600, 10)), image.getpixel((600, 2990))
    assert isinstance(top, tuple) and isinstance(bottom, tuple)
    assert top[0] > 200 > top[2] and bottom[2] > 200 > bottom[0]
    assert await page(driver, "scrollY") == 120  # the page's scroll is put back
    scrolled = await act(driver, action="scroll", scroll_direction="down", scroll_amount=3,
                         coordinate=[640, 400])
    assert scrolled["scrollPosition"]["y"] == 420 and scrolled["note"] == SCRIPT_SCROLL  # 120 + 3 notches
    await act(driver, action="navigate", url=f"{site}/late.html")
    waited = await act(driver, action="wait_for", selector="#late", timeoutS=10)
    assert waited["found"] is True and 0.3 < waited["waitedS"] < 10
    assert (await act(driver, action="wait_for", selector="#never", timeoutS=0.3))["found"] is False
    resized = await act(driver, action="set_viewport", width=320, height=240)
    assert resized == {"display": {"width": 320, "height": 240}, "changed": True}
    assert await page(driver, "[innerWidth, innerHeight]") == [320, 240]
    shot = await act(driver, action="screenshot")
    assert (shot["imageSize"]["width"], shot["imageSize"]["height"]) == (320, 240)
    await act(driver, action="set_viewport", width=1280, height=800)


@pytest.mark.timeout(120)
async def test_bad_input_is_refused_and_the_page_untouched(driver: WebKitDriver, site: str) -> None:
    await act(driver, action="navigate", url=f"{site}/button.html")
    for payload, field in [
        ({"action": "navigate", "url": "file:///etc/passwd"}, "action.url"),
        ({"action": "set_viewport", "width": 319, "height": 240}, "action.width"),
        ({"action": "click", "coordinate": [5000, 10]}, "action.coordinate"),
    ]:
        with pytest.raises(FieldError) as info:
            await act(driver, **payload)
        assert info.value.field == field
    with pytest.raises(FieldError, match="not a valid css selector"):
        await act(driver, action="click", selector="#b[")
    with pytest.raises(FieldError, match="matches no element"):
        await act(driver, action="fill", selector="#nothing", text="x")
    with pytest.raises(FieldError, match="not a valid XPath"):
        await act(driver, action="click", selector="xpath=//[")
    with pytest.raises(Conflict, match="plain http://"):
        await act(driver, action="clipboard_read")
    assert (await driver._page_json())["url"] == f"{site}/button.html"
    assert await page(driver, "document.title") == "button"


@pytest.mark.timeout(120)
async def test_pointer_verbs_reload_dialogs_and_a_persons_input(driver: WebKitDriver, site: str) -> None:
    await act(driver, action="navigate", url=f"{site}/pointer.html")
    await act(driver, action="drag", start_coordinate=[10, 20], coordinate=[110, 70])
    events = await page(driver, "events")
    assert events[0] == ["mousedown", 10, 20, 1] and ["drag", 110, 70, 1] in events
    assert events[-2:] == [["mouseup", 110, 70, 0], ["click", 110, 70, 0]]
    await page(driver, "events.length = 0")
    steps = (plan_input({"type": "button", "button": "left", "down": True, "x": 640, "y": 400}, (1280, 800))[0]
             + plan_input({"type": "button", "button": "left", "down": False}, (1280, 800))[0])
    after = await driver.replay(steps, PointerState())
    assert (after.x, after.y) == (640, 400) and driver.pointer == (640, 400)
    assert await page(driver, "events") == [
        ["mousedown", 640, 400, 1], ["mouseup", 640, 400, 0], ["click", 640, 400, 0]]
    # A dialog never stalls a verb: WebKit dismisses it, the console says so.
    await page(driver, "(setTimeout(() => alert('hey there'), 0), 1)")
    seen = ""
    with trio.fail_after(10):  # the page's own timer raises it: the next commands meet it
        while "[dialog] hey there" not in seen:
            seen += (await act(driver, action="extract", kind="console"))["content"]["text"]
    assert seen.count("[dialog] hey there") == 1
    await act(driver, action="navigate", url=f"{site}/count.html")
    first = int((await page(driver, "document.title")).split()[-1])
    hard = await act(driver, action="reload", hard=True)
    assert hard["loaded"] is True and hard["hard"] is False and hard["note"].startswith(NO_HARD_RELOAD)
    assert hard["title"]["text"] == f"served {first + 1}"
    assert (await act(driver, action="stop_loading"))["stopped"] is True


@pytest.mark.timeout(120)
async def test_the_clipboard_is_the_displays_and_the_page_pastes_and_copies_it(
        driver: WebKitDriver, tls_site: str) -> None:
    out = await act(driver, action="navigate", url=f"{tls_site}/input.html")
    assert out["loaded"] is True
    wrote = await act(driver, action="clipboard_write", text="héllo 📋")
    assert wrote == {"selection": "clipboard", "via": "x-clipboard", "bytes": len("héllo 📋".encode())}
    await act(driver, action="click", selector="#t")
    await act(driver, action="key", text="Control+v")  # the page's own paste reads it
    assert await page(driver, "document.getElementById('t').value") == "héllo 📋"
    await page(driver, "(document.getElementById('t').value = 'copied by the page', 1)")
    await act(driver, action="key", text="Control+a")
    await act(driver, action="key", text="Control+c")
    with trio.fail_after(10):
        while (read := await act(driver, action="clipboard_read"))["content"]["text"] != "copied by the page":
            await trio.sleep(0.1)
    assert read["content"]["untrusted"] is True and read["via"] == "x-clipboard"


@pytest.mark.timeout(120)
async def test_without_the_display_clipboard_webkit_says_the_api_needs_a_gesture(
        webkit: HostChromium, tls_site: str) -> None:
    conn = await _connect(webkit.ws_url)
    try:
        async with open_webkit(conn, insecure_certs=True) as d:
            await act(d, action="navigate", url=f"{tls_site}/input.html")
            with pytest.raises(Conflict, match="gesture") as info:
                await act(d, action="clipboard_write", text="x")
            assert info.value.data["reason"] == "engine limit"
    finally:
        await conn.aclose()


@pytest.mark.timeout(120)
async def test_profile_export_and_import(driver: WebKitDriver, site: str) -> None:
    await act(driver, action="navigate", url=f"{site}/input.html")
    await page(driver, "(document.cookie = 'sid=abc123; path=/; max-age=3600', localStorage.setItem('k', 'v'))")
    state = await driver.export_profile()
    assert any(c["name"] == "sid" and c["value"] == "abc123" for c in state.cookies)
    assert state.storage[site.lower()] == {"k": "v"} and state.tabs == [f"{site}/input.html"]
    await driver._cmd("DELETE", "/cookie")
    await page(driver, "(localStorage.clear(), 1)")
    assert await driver.import_profile(state) == []
    await act(driver, action="navigate", url=f"{site}/button.html")
    assert await page(driver, "[document.cookie, localStorage.getItem('k')]") == ["sid=abc123", "v"]


@pytest.mark.timeout(120)
async def test_a_long_text_is_typed_whole_across_chunks(driver: WebKitDriver, site: str) -> None:
    await act(driver, action="navigate", url=f"{site}/input.html")
    await act(driver, action="click", selector="#t")
    text = "".join(chr(0x41 + i % 26) if i % 7 else "é" for i in range(400))  # > 1 chunk of keys
    out = await act(driver, action="type", text=text)
    assert out["characters"] == 400
    assert await page(driver, "document.getElementById('t').value") == text


@pytest.mark.timeout(120)
async def test_a_driver_that_exits_fails_pending_commands(tmp_path: Path) -> None:
    host = await trio.to_thread.run_sync(start_host_webkit, tmp_path)
    try:
        conn = await _connect(host.ws_url)
        errors: list[str] = []

        async def hang() -> None:
            try:
                async with open_webkit(conn) as d:
                    await d._script("() => new Promise(() => {})", timeout=30)
            except (CDPClosed, CDPCommandFailed) as exc:
                errors.append(str(exc))

        with trio.fail_after(60):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(hang)
                with trio.fail_after(40):
                    while conn.commands < 4:
                        await trio.sleep(0.05)
                await trio.sleep(0.5)
                os.killpg(host.proc.pid, signal.SIGKILL)
        assert errors and "closed" in errors[0]
        with pytest.raises(CDPClosed):
            await conn.command("GET", "/status")
        await conn.aclose()
    finally:
        await trio.to_thread.run_sync(stop_host_chromium, host)
