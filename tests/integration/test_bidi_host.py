"""The Firefox driver and the BiDi client against the host's real Firefox ESR.

No VM: the same engine and client a browser rig runs, on the host, so every
verb's meaning is checked against a real Firefox in seconds. The fixture
starts ``firefox-esr --headless`` with the rig's preferences, its remote agent
on an ephemeral loopback port, and kills its process group by pid at
teardown; pages come from the HTTP server of ``test_cdp_host`` (the same
pages the Chromium driver is held to).
"""

from __future__ import annotations

import base64
import io
import os
import signal
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import trio
from PIL import Image

from rigd.browser.cdp import CDPConnection, open_cdp
from rigd.browser.firefox import NO_HARD_RELOAD, FirefoxDriver, open_firefox
from rigd.browser.live_input import PointerState
from rigd.browser.testing import FIREFOX, HostChromium, start_host_firefox, stop_host_chromium
from rigd.errors import Conflict, FieldError
from rigd.model import Surface
from rigd.protocols.bidi import BiDiProtocol
from rigd.protocols.cdp import CDPClosed
from rigd.server.live import plan_input
from rigd.verbs import parse_action
from rigd.verbs.base import ParseContext
from tests.integration import test_cdp_host

pytestmark = pytest.mark.skipif(not Path(FIREFOX).exists(), reason="no firefox-esr on this host")


@pytest.fixture(scope="module")
def firefox(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HostChromium]:
    home = tmp_path_factory.mktemp("firefox")
    try:
        host = start_host_firefox(home)
    except RuntimeError as exc:
        pytest.fail(str(exc))
    try:
        yield host
    finally:
        stop_host_chromium(host)


#: The pages and server of the Chromium driver's host test, served here afresh.
site = test_cdp_host.site
tls_site = test_cdp_host.tls_site


def _bidi(url: str) -> Any:
    return open_cdp(url, protocol=BiDiProtocol())


@pytest.fixture
async def driver(firefox: HostChromium) -> AsyncIterator[FirefoxDriver]:
    async with _bidi(firefox.ws_url) as conn, open_firefox(conn, insecure_certs=True) as d:
        yield d
        await conn.send("session.end", {})


async def act(d: FirefoxDriver, **payload: Any) -> dict[str, Any]:
    action = parse_action("browser_use", payload, ParseContext(d.viewport, Surface.BROWSER))
    if isinstance(action, FieldError):
        raise action
    with trio.fail_after(45):
        return await d.perform(action)


async def page(d: FirefoxDriver, expression: str) -> Any:
    """An expression's JSON value in the page's own realm (what the page itself sees)."""
    return await d._script(f"() => ({expression})", page_realm=True)


@pytest.mark.timeout(90)
async def test_navigate_and_click_by_selector_and_coordinates(driver: FirefoxDriver, site: str) -> None:
    assert driver.version.split(".")[0].isdigit()
    out = await act(driver, action="navigate", url=f"{site}/button.html")
    assert out["loaded"] is True and out["status"] == 200
    assert out["url"] == f"{site}/button.html" and out["title"]["untrusted"] is True
    clicked = await act(driver, action="click", selector="#b")
    assert clicked["coordinate"] == [200, 125]
    assert await page(driver, "document.title") == "b clicked"
    await act(driver, action="click", coordinate=[150, 320])
    assert await page(driver, "document.title") == "c clicked"
    for selector, want in (("text=B", "b"), ("//button[@id='c']", "c"), ('"B"', "b")):
        await act(driver, action="click", selector=selector)
        assert await page(driver, "document.title") == f"{want} clicked"
    missing = await act(driver, action="navigate", url=f"{site}/nope.html")
    assert missing["status"] == 404
    fragment = await act(driver, action="navigate", url=f"{site}/nope.html#part")
    assert "same-document" in fragment["note"]


@pytest.mark.timeout(90)
async def test_fill_submit_history_and_keys(driver: FirefoxDriver, site: str) -> None:
    await act(driver, action="navigate", url=f"{site}/form.html")
    assert await act(driver, action="fill", selector="#q", text="rigs and BiDi") == {
        "selector": "#q", "characters": 13}
    await act(driver, action="click", selector="#go")
    await act(driver, action="wait_for", selector="#out", timeoutS=10)
    assert await page(driver, "document.title") == "result: rigs and BiDi"
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


@pytest.mark.timeout(90)
async def test_extracts_console_dom_and_a_labelled_a11y(driver: FirefoxDriver, site: str) -> None:
    await act(driver, action="extract", kind="console")
    await act(driver, action="navigate", url=f"{site}/console.html")
    await act(driver, action="wait_for", selector="h1", timeoutS=5)
    with trio.fail_after(10):
        while "late failure" not in "\n".join(driver.console):
            await trio.sleep(0.05)
    console = await act(driver, action="extract", kind="console")
    text = console["content"]["text"]
    assert console["content"]["untrusted"] is True
    assert "[log] hello from the page 42" in text and "[warn] careful" in text
    assert "[exception]" in text and "late failure" in text
    assert (await act(driver, action="extract", kind="console"))["entries"] == 0
    dom = await act(driver, action="extract", kind="dom")
    assert "<h1>Console page</h1>" in dom["content"]["text"]
    await act(driver, action="navigate", url=f"{site}/a11y.html")
    a11y = await act(driver, action="extract", kind="a11y")
    tree = a11y["content"]["text"]
    assert a11y["source"] == FirefoxDriver.A11Y_SOURCE and "DOM-derived" in a11y["source"]
    assert 'heading "Welcome home"' in tree
    assert 'button "Close dialog"' in tree and 'link "Search form"' in tree


@pytest.mark.timeout(90)
async def test_screenshots_scroll_viewport_and_wait_for(driver: FirefoxDriver, site: str) -> None:
    await act(driver, action="navigate", url=f"{site}/tall.html")
    shot = await act(driver, action="screenshot")
    image = Image.open(io.BytesIO(base64.b64decode(shot["image"]["data"])))
    assert image.format == "JPEG" and image.size == (1280, 800) and shot["source"] == "bidi"
    full = await act(driver, action="screenshot", full_page=True)
    assert full["pageSize"]["height"] == 3000
    image = Image.open(io.BytesIO(base64.b64decode(full["image"]["data"])))
    assert image.size[1] == 3000
    top, bottom = image.getpixel((600, 10)), image.getpixel((600, 2990))
    assert isinstance(top, tuple) and isinstance(bottom, tuple)
    assert top[0] > 200 > top[2] and bottom[2] > 200 > bottom[0]
    scrolled = await act(driver, action="scroll", scroll_direction="down", scroll_amount=3,
                         coordinate=[640, 400])
    assert scrolled["scrollPosition"]["y"] == 300
    await act(driver, action="navigate", url=f"{site}/late.html")
    waited = await act(driver, action="wait_for", selector="#late", timeoutS=10)
    assert waited["found"] is True and 0.3 < waited["waitedS"] < 10
    assert (await act(driver, action="wait_for", selector="#never", timeoutS=0.3))["found"] is False
    resized = await act(driver, action="set_viewport", width=320, height=240)
    assert resized == {"display": {"width": 320, "height": 240}, "changed": True}
    shot = await act(driver, action="screenshot")
    assert (shot["imageSize"]["width"], shot["imageSize"]["height"]) == (320, 240)
    await act(driver, action="set_viewport", width=1280, height=800)


@pytest.mark.timeout(90)
async def test_bad_input_is_refused_and_the_page_untouched(driver: FirefoxDriver, site: str) -> None:
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
    with pytest.raises(FieldError, match="not a valid css selector"):
        await act(driver, action="wait_for", selector="#b[", timeoutS=1)
    with pytest.raises(Conflict, match="plain http://"):
        await act(driver, action="clipboard_read")
    assert (await driver._page_json())["url"] == f"{site}/button.html"
    assert await page(driver, "document.title") == "button"


@pytest.mark.timeout(90)
async def test_pointer_verbs_reload_and_a_persons_input(driver: FirefoxDriver, site: str) -> None:
    await act(driver, action="navigate", url=f"{site}/pointer.html")
    await act(driver, action="drag", start_coordinate=[10, 20], coordinate=[110, 70])
    events = await page(driver, "events")
    assert events[0] == ["mousedown", 10, 20, 1] and ["drag", 110, 70, 1] in events
    assert events[-2:] == [["mouseup", 110, 70, 0], ["click", 110, 70, 0]]
    await page(driver, "events.length = 0")
    await act(driver, action="mouse_move", coordinate=[300, 200])
    await act(driver, action="left_mouse_down")
    await act(driver, action="mouse_move", coordinate=[320, 240])
    await act(driver, action="left_mouse_up")
    assert await page(driver, "events") == [
        ["mousedown", 300, 200, 1], ["drag", 320, 240, 1], ["mouseup", 320, 240, 0], ["click", 320, 240, 0]]
    # A person's live-view click, replayed through the same input sources.
    await page(driver, "events.length = 0")
    steps = (plan_input({"type": "button", "button": "left", "down": True, "x": 640, "y": 400}, (1280, 800))[0]
             + plan_input({"type": "button", "button": "left", "down": False}, (1280, 800))[0])
    after = await driver.replay(steps, PointerState())
    assert (after.x, after.y) == (640, 400) and driver.pointer == (640, 400)
    assert await page(driver, "events") == [
        ["mousedown", 640, 400, 1], ["mouseup", 640, 400, 0], ["click", 640, 400, 0]]
    await act(driver, action="navigate", url=f"{site}/count.html")
    first = int((await page(driver, "document.title")).split()[-1])
    hard = await act(driver, action="reload", hard=True)
    assert hard["loaded"] is True and hard["hard"] is False and hard["note"] == NO_HARD_RELOAD
    assert hard["title"]["text"] == f"served {first + 1}"
    assert (await act(driver, action="stop_loading"))["stopped"] is True


@pytest.mark.timeout(90)
async def test_clipboard_round_trip_on_a_secure_page(driver: FirefoxDriver, tls_site: str) -> None:
    out = await act(driver, action="navigate", url=f"{tls_site}/input.html")
    assert out["loaded"] is True
    await act(driver, action="clipboard_write", text="héllo 📋")
    read = await act(driver, action="clipboard_read")
    assert read["content"]["untrusted"] is True and read["content"]["text"] == "héllo 📋"


@pytest.mark.timeout(90)
async def test_profile_export_and_import(driver: FirefoxDriver, site: str) -> None:
    await act(driver, action="navigate", url=f"{site}/input.html")
    await page(driver, "(document.cookie = 'sid=abc123; path=/; max-age=3600', localStorage.setItem('k', 'v'))")
    state = await driver.export_profile()
    assert any(c["name"] == "sid" and c["value"] == "abc123" for c in state.cookies)
    assert state.storage[site.lower()] == {"k": "v"} and state.tabs[0] == f"{site}/input.html"
    await driver.conn.send("storage.deleteCookies", {})
    await page(driver, "localStorage.clear()")
    assert await driver.import_profile(state) == []
    await act(driver, action="navigate", url=f"{site}/button.html")
    assert await page(driver, "[document.cookie, localStorage.getItem('k')]") == ["sid=abc123", "v"]


@pytest.mark.timeout(90)
async def test_a_browser_that_exits_fails_pending_commands(tmp_path: Path) -> None:
    host = await trio.to_thread.run_sync(start_host_firefox, tmp_path)
    try:
        async with _bidi(host.ws_url) as conn:
            errors: list[str] = []

            async def hang(c: CDPConnection) -> None:
                try:
                    async with open_firefox(c) as d:
                        await d._script("() => new Promise(() => {})", timeout=30)
                except CDPClosed as exc:
                    errors.append(str(exc))

            with trio.fail_after(40):
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(hang, conn)
                    await trio.sleep(3)
                    os.killpg(host.proc.pid, signal.SIGKILL)
            assert errors and "the browser closed the DevTools connection" in errors[0]
            with pytest.raises(CDPClosed):
                await conn.send("session.status", {})
    finally:
        await trio.to_thread.run_sync(stop_host_chromium, host)


@pytest.mark.timeout(120)
async def test_a_long_text_is_typed_whole_across_chunks(driver: FirefoxDriver, site: str) -> None:
    await act(driver, action="navigate", url=f"{site}/input.html")
    await act(driver, action="click", selector="#t")
    text = "".join(chr(0x41 + i % 26) if i % 7 else "é" for i in range(700))  # > 2 chunks of keys
    out = await act(driver, action="type", text=text)
    assert out["characters"] == 700
    assert await page(driver, "document.getElementById('t').value") == text
