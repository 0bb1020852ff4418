"""The Chromium driver and CDP client against the host's real ``/usr/bin/chromium``.

No VM: this is the "same engine on the host, driven by the same client" peer
that the browser rig's bench compares against. The fixture starts Chromium
headless with its own profile and DevTools on an ephemeral loopback port
(read from ``DevToolsActivePort``), and kills its process group by pid at
teardown; pages come from an HTTP server on 127.0.0.1 run by the test.
"""

from __future__ import annotations

import base64
import io
import os
import signal
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import trio
from PIL import Image

from rigd.browser.cdp import CDPConnection, open_cdp
from rigd.browser.chromium import ChromiumDriver, open_chromium
from rigd.browser.testing import CHROMIUM, HostChromium, serve_pages, start_host_chromium, stop_host_chromium
from rigd.errors import Conflict, FieldError
from rigd.model import Surface
from rigd.protocols.cdp import CDPClosed, CDPTimeout
from rigd.verbs import parse_action
from rigd.verbs.base import ParseContext

pytestmark = pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="no chromium on this host")

PAGES: dict[str, str] = {
    "/button.html": """<!doctype html><title>button</title>
<style>body{margin:0} #b{position:absolute;left:100px;top:100px;width:200px;height:50px}
#c{position:absolute;left:100px;top:300px;width:200px;height:50px}</style>
<button id="b" onclick="document.title='b clicked'; console.log('clicked', 'b')">B</button>
<button id="c" onclick="document.title='c clicked'">C</button>""",
    "/form.html": """<!doctype html><title>form</title>
<form action="/result.html" method="get"><label for="q">Query</label>
<input id="q" name="q"><button id="go" type="submit">Search</button></form>""",
    "/result.html": """<!doctype html><title>result</title>
<p id="out"></p><script>document.getElementById('out').textContent =
new URLSearchParams(location.search).get('q'); document.title = 'result: ' +
new URLSearchParams(location.search).get('q');</script>""",
    "/input.html": """<!doctype html><title>input</title><input id="t">""",
    "/console.html": """<!doctype html><title>console</title><h1>Console page</h1>
<script>console.log('hello from the page', 42); console.warn('careful');
setTimeout(() => { throw new Error('late failure'); }, 0);</script>""",
    "/a11y.html": """<!doctype html><title>a11y</title><main><h1>Welcome home</h1>
<nav aria-label="Site"><a href="/form.html">Search form</a></nav>
<button aria-label="Close dialog">X</button></main>""",
    "/tall.html": """<!doctype html><title>tall</title><style>body{margin:0}</style>
<div style="height:3000px;background:linear-gradient(red,blue)">tall</div>""",
    "/pointer.html": """<!doctype html><title>pointer</title><style>body{margin:0;height:2000px}</style>
<script>window.events = [];
for (const kind of ['mousedown', 'mouseup', 'click']) {
  addEventListener(kind, e => events.push([kind, e.clientX, e.clientY, e.buttons]));
}
addEventListener('mousemove', e => { if (e.buttons) events.push(['drag', e.clientX, e.clientY, e.buttons]); });
</script>""",
    "/big.html": "<!doctype html><title>big</title><p>" + "lorem ipsum " * 10_000 + "</p>",
    "/hostile.html": """<!doctype html><title>hostile</title><p id="p">plain</p><script>
String.prototype.slice = function () { return 'x'.repeat(5000000); };
Object.defineProperty(window, 'scrollX', {get() { throw new Error('no scroll for you'); }});
document.querySelector = () => null;
</script>""",
    "/late.html": """<!doctype html><title>late</title><script>setTimeout(() => {
const d = document.createElement('div'); d.id = 'late'; d.textContent = 'here';
document.body.appendChild(d); }, 800);</script>""",
}


#: Requests served per path (``/count.html`` says its own count: a hard reload must reach us).
SERVED: dict[str, int] = {}


def _respond(path_qs: str) -> tuple[int, str] | None:
    path = path_qs.split("?", 1)[0]
    SERVED[path] = SERVED.get(path, 0) + 1
    if path == "/hang.html":
        time.sleep(8)  # a server that never answers, as far as a 1 s deadline can tell
    if path == "/count.html":
        return 200, f"<!doctype html><title>served {SERVED[path]}</title>"
    body = PAGES.get(path)
    return None if body is None else (200, body)


@pytest.fixture(scope="module")
def site() -> Iterator[str]:
    with serve_pages(_respond) as url:
        yield url


@pytest.fixture(scope="module")
def tls_site() -> Iterator[str]:
    """The same pages over https (a trustme certificate; the test browser ignores its CA)."""
    import ssl

    import trustme

    ca = trustme.CA()
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(context)
    with serve_pages(_respond, tls=context) as url:
        yield url


@pytest.fixture(scope="module")
def chromium(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HostChromium]:
    home = tmp_path_factory.mktemp("chromium")
    try:
        host = start_host_chromium(home, "--ignore-certificate-errors")
    except RuntimeError as exc:
        pytest.fail(str(exc))
    try:
        yield host
    finally:
        stop_host_chromium(host)


@pytest.fixture
async def driver(chromium: HostChromium) -> AsyncIterator[ChromiumDriver]:
    async with open_cdp(chromium.ws_url) as conn, open_chromium(conn) as d:
        yield d


async def act(d: ChromiumDriver, **payload: Any) -> dict[str, Any]:
    action = parse_action("browser_use", payload, ParseContext(d.viewport, Surface.BROWSER))
    if isinstance(action, FieldError):
        raise action
    with trio.fail_after(45):
        return await d.perform(action)


async def title(d: ChromiumDriver) -> str:
    """The document's title (the browser's copy of it, in history, trails the renderer's)."""
    text: str = await d._eval("document.title")
    return text


@pytest.mark.timeout(90)
async def test_navigate_and_click_by_selector_and_coordinates(driver: ChromiumDriver, site: str) -> None:
    out = await act(driver, action="navigate", url=f"{site}/button.html")
    assert out["loaded"] is True and out["status"] == 200
    assert out["url"] == f"{site}/button.html" and out["title"]["untrusted"] is True
    clicked = await act(driver, action="click", selector="#b")
    assert clicked["coordinate"] == [200, 125]
    assert await title(driver) == "b clicked"
    await act(driver, action="click", coordinate=[150, 320])
    assert await title(driver) == "c clicked"
    await act(driver, action="click", selector="text=B")
    assert await title(driver) == "b clicked"
    await act(driver, action="click", selector="//button[@id='c']")
    assert await title(driver) == "c clicked"
    await act(driver, action="click", selector='"B"')
    assert await title(driver) == "b clicked"
    missing = await act(driver, action="navigate", url=f"{site}/nope.html")
    assert missing["status"] == 404


@pytest.mark.timeout(90)
async def test_fill_and_submit_a_form_then_history_back(driver: ChromiumDriver, site: str) -> None:
    await act(driver, action="navigate", url=f"{site}/form.html")
    filled = await act(driver, action="fill", selector="#q", text="rigs and CDP")
    assert filled == {"selector": "#q", "characters": 12}
    with driver.page.subscribe({"Page.lifecycleEvent"}) as life:
        await act(driver, action="click", selector="#go")
        await driver._wait_load(life, None, 30)
    assert await title(driver) == "result: rigs and CDP"
    back = await act(driver, action="history", direction="back")
    assert back["url"] == f"{site}/form.html" and back["loaded"] is True
    forward = await act(driver, action="history", direction="forward")
    assert forward["url"].startswith(f"{site}/result.html?q=")
    with pytest.raises(FieldError, match="no later page"):
        await act(driver, action="history", direction="forward")
    await act(driver, action="history", direction="back")
    await act(driver, action="fill", selector="id=q", text="by Enter")
    with driver.page.subscribe({"Page.lifecycleEvent"}) as life:
        await act(driver, action="key", text="Enter")  # implicit submission
        await driver._wait_load(life, None, 30)
    assert await title(driver) == "result: by Enter"


@pytest.mark.timeout(90)
async def test_type_unicode_at_the_caret_and_keys(driver: ChromiumDriver, site: str) -> None:
    await act(driver, action="navigate", url=f"{site}/input.html")
    await act(driver, action="click", selector="#t")
    typed = await act(driver, action="type", text="héllo 世界")
    assert typed["focusedEditable"] is True and typed["characters"] == 8
    assert await driver._eval("document.getElementById('t').value") == "héllo 世界"
    await act(driver, action="key", text="Control+a")
    await act(driver, action="key", text="Backspace")
    await act(driver, action="key", text="Shift+KeyX")
    await act(driver, action="key", text="!")
    assert await driver._eval("document.getElementById('t').value") == "X!"


@pytest.mark.timeout(90)
async def test_extracts_are_framed_and_the_console_is_buffered(driver: ChromiumDriver, site: str) -> None:
    await act(driver, action="extract", kind="console")  # empty what earlier tests logged
    await act(driver, action="navigate", url=f"{site}/console.html")
    await trio.sleep(0.3)
    console = await act(driver, action="extract", kind="console")
    text = console["content"]["text"]
    assert console["content"]["untrusted"] is True
    assert "[log] hello from the page 42" in text and "[warning] careful" in text
    assert "late failure" in text
    again = await act(driver, action="extract", kind="console")
    assert again["entries"] == 0
    dom = await act(driver, action="extract", kind="dom")
    assert dom["content"]["untrusted"] is True and "<h1>Console page</h1>" in dom["content"]["text"]
    await act(driver, action="navigate", url=f"{site}/a11y.html")
    a11y = await act(driver, action="extract", kind="a11y")
    tree = a11y["content"]["text"]
    assert 'heading "Welcome home"' in tree
    assert 'button "Close dialog"' in tree and 'link "Search form"' in tree


@pytest.mark.timeout(90)
async def test_screenshots_viewport_and_full_page(driver: ChromiumDriver, site: str) -> None:
    await act(driver, action="navigate", url=f"{site}/tall.html")
    shot = await act(driver, action="screenshot")
    image = Image.open(io.BytesIO(base64.b64decode(shot["image"]["data"])))
    assert image.size == (1280, 800) == (shot["imageSize"]["width"], shot["imageSize"]["height"])
    # The page is as wide as the viewport less its scrollbar, and as tall as its content.
    width = await driver._eval("document.documentElement.clientWidth")
    full = await act(driver, action="screenshot", full_page=True)
    # A screenshot is an observation: the viewport is as it was. (The renderer lays the page out
    # again after the capture's own override is cleared, a moment later under load: wait for it.)
    with trio.move_on_after(10):
        while (sizes := await driver._eval("[innerWidth, innerHeight, document.documentElement.clientWidth]")) \
                != [1280, 800, width]:
            await trio.sleep(0.1)
    assert sizes == [1280, 800, width], "a screenshot is an observation: the viewport is as it was"
    assert full["pageSize"] == {"width": width, "height": 3000} and 1200 < width <= 1280
    image = Image.open(io.BytesIO(base64.b64decode(full["image"]["data"])))
    assert image.size == (width, 3000) and image.size[1] > shot["display"]["height"]
    top, bottom = image.getpixel((600, 10)), image.getpixel((600, 2990))
    assert isinstance(top, tuple) and isinstance(bottom, tuple)
    assert top[0] > 200 > top[2] and bottom[2] > 200 > bottom[0]  # red at the top, blue at the foot
    scrolled = await act(driver, action="scroll", scroll_direction="down", scroll_amount=3,
                         coordinate=[640, 400])
    assert scrolled["scrollPosition"]["y"] == 300
    # The live lane's scaled still (BrowserDriver.still; was checked in test_browser_image's raw boot):
    # the viewport scaled down to fit, as a JPEG of the size it says.
    data, iw, ih = await driver.capture(max_w=640, max_h=400, quality=70)
    assert (iw, ih) == (640, 400) and data[:2] == b"\xff\xd8"
    with Image.open(io.BytesIO(data)) as still:
        assert still.size == (640, 400)


@pytest.mark.timeout(90)
async def test_wait_for_a_late_element_and_set_viewport(driver: ChromiumDriver, site: str) -> None:
    await act(driver, action="navigate", url=f"{site}/late.html")
    waited = await act(driver, action="wait_for", selector="#late", timeoutS=10)
    assert waited["found"] is True and 0.3 < waited["waitedS"] < 10
    assert (await act(driver, action="wait_for", selector="text=HERE", timeoutS=1))["found"] is True
    quick = await act(driver, action="wait_for", selector="#never", timeoutS=0.3)
    assert quick["found"] is False
    resized = await act(driver, action="set_viewport", width=320, height=240)
    assert resized == {"display": {"width": 320, "height": 240}, "changed": True}
    assert await driver._eval("[innerWidth, innerHeight]") == [320, 240]
    shot = await act(driver, action="screenshot")
    assert (shot["imageSize"]["width"], shot["imageSize"]["height"]) == (320, 240)


@pytest.mark.timeout(90)
async def test_bad_input_is_refused_and_the_page_untouched(driver: ChromiumDriver, site: str) -> None:
    await act(driver, action="navigate", url=f"{site}/button.html")
    for payload, field in [
        ({"action": "navigate", "url": "file:///etc/passwd"}, "action.url"),
        ({"action": "navigate", "url": "javascript:alert(1)"}, "action.url"),
        ({"action": "set_viewport", "width": 319, "height": 240}, "action.width"),
        ({"action": "wait_for", "selector": "#b", "timeoutS": 31}, "action.timeoutS"),
        ({"action": "click", "coordinate": [5000, 10]}, "action.coordinate"),
    ]:
        with pytest.raises(FieldError) as info:
            await act(driver, **payload)
        assert info.value.field == field
    for selector in ("#b[", "p:::x"):
        with pytest.raises(FieldError, match="not a valid CSS selector") as info:
            await act(driver, action="click", selector=selector)
        assert info.value.field == "action.selector"
    with pytest.raises(FieldError, match="matches no element"):
        await act(driver, action="fill", selector="#nothing", text="x")
    with pytest.raises(FieldError, match="matches no element"):
        await act(driver, action="click", selector="text=no such words")
    with pytest.raises(FieldError, match="not a valid XPath expression"):
        await act(driver, action="click", selector="xpath=//[")
    with pytest.raises(FieldError, match="role= engine is not supported"):
        await act(driver, action="click", selector="role=button")
    with pytest.raises(FieldError, match="not a valid CSS selector"):
        await act(driver, action="wait_for", selector="#b[", timeoutS=1)
    with pytest.raises(Conflict, match="plain http://, which has no Clipboard API"):
        await act(driver, action="clipboard_read")
    with pytest.raises(Conflict, match="plain http://"):
        await act(driver, action="clipboard_write", text="secret")
    assert (await driver._page_json())["url"] == f"{site}/button.html"
    assert await title(driver) == "button"


@pytest.mark.timeout(90)
async def test_a_browser_that_exits_fails_pending_commands(site: str,
                                                          tmp_path: Path) -> None:
    """A second, private Chromium is killed under a pending command."""
    host = await trio.to_thread.run_sync(start_host_chromium, tmp_path)
    proc = host.proc
    try:
        url = host.ws_url
        async with open_cdp(url) as conn:
            errors: list[str] = []

            async def hang(c: CDPConnection) -> None:
                try:
                    # Waits on a promise that never settles: pending until the browser dies.
                    async with open_chromium(c) as d:
                        await d._eval("new Promise(() => {})", await_promise=True, timeout=30)
                except CDPClosed as exc:
                    errors.append(str(exc))

            with trio.fail_after(40):
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(hang, conn)
                    await trio.sleep(2)
                    os.killpg(proc.pid, signal.SIGKILL)
            assert errors and "the browser closed the DevTools connection" in errors[0]
            with pytest.raises(CDPClosed):
                await conn.send("Browser.getVersion")
    finally:
        await trio.to_thread.run_sync(stop_host_chromium, host)


@pytest.mark.timeout(90)
async def test_pointer_verbs_drag_and_press(driver: ChromiumDriver, site: str) -> None:
    await act(driver, action="navigate", url=f"{site}/pointer.html")
    assert await act(driver, action="drag", start_coordinate=[10, 20], coordinate=[110, 70]) == {
        "from": [10, 20], "to": [110, 70]}
    events = await driver._eval("events", main_world=True)
    assert events[0] == ["mousedown", 10, 20, 1]
    assert ["drag", 110, 70, 1] in events
    assert events[-2:] == [["mouseup", 110, 70, 0], ["click", 110, 70, 0]]
    await driver._eval("events.length = 0", main_world=True)
    await act(driver, action="mouse_move", coordinate=[300, 200])
    down = await act(driver, action="left_mouse_down")
    assert down == {"coordinate": [300, 200], "button": "left", "down": True}
    await act(driver, action="mouse_move", coordinate=[320, 240])
    await act(driver, action="left_mouse_up")
    assert await driver._eval("events", main_world=True) == [
        ["mousedown", 300, 200, 1], ["drag", 320, 240, 1], ["mouseup", 320, 240, 0],
        ["click", 320, 240, 0],
    ]


@pytest.mark.timeout(90)
async def test_reload_and_stop_loading(driver: ChromiumDriver, site: str) -> None:
    await act(driver, action="navigate", url=f"{site}/count.html")
    first = int((await title(driver)).split()[-1])
    soft = await act(driver, action="reload")
    assert soft["loaded"] is True and soft["hard"] is False
    hard = await act(driver, action="reload", hard=True)
    assert hard["hard"] is True and hard["title"]["text"] == f"served {first + 2}"
    stopped = await act(driver, action="stop_loading")
    assert stopped["stopped"] is True and stopped["url"] == f"{site}/count.html"


@pytest.mark.timeout(90)
async def test_clipboard_round_trip_on_a_secure_page(driver: ChromiumDriver, tls_site: str) -> None:
    out = await act(driver, action="navigate", url=f"{tls_site}/input.html")
    assert out["loaded"] is True
    written = await act(driver, action="clipboard_write", text="héllo 📋")
    assert written == {"selection": "clipboard", "bytes": len("héllo 📋".encode())}
    read = await act(driver, action="clipboard_read")
    assert read["content"]["untrusted"] is True and read["content"]["text"] == "héllo 📋"


@pytest.mark.timeout(90)
async def test_a_message_over_the_cap_drops_the_connection(chromium: HostChromium, site: str) -> None:
    """A reply larger than the client's cap (here 64 KiB) closes the socket (1009): the command
    fails saying so, and so does every later one."""
    async with open_cdp(chromium.ws_url, max_message_chars=64 * 1024) as conn, \
            open_chromium(conn) as d:
        await act(d, action="navigate", url=f"{site}/big.html")
        with pytest.raises(CDPClosed, match="over the size cap"):
            await act(d, action="extract", kind="dom")  # ~120 KB of HTML in one reply
        with pytest.raises(CDPClosed, match="over the size cap"):
            await act(d, action="screenshot")


@pytest.mark.timeout(90)
async def test_the_page_cannot_reach_rigds_scripts(driver: ChromiumDriver, site: str) -> None:
    """rigd's scripts run in an isolated world: the page's replaced built-ins do not touch them."""
    await act(driver, action="navigate", url=f"{site}/hostile.html")
    dom = await act(driver, action="extract", kind="dom")
    assert '<p id="p">plain</p>' in dom["content"]["text"] and dom["content"]["truncated"] is False
    await act(driver, action="wait_for", selector="text=plain", timeoutS=2)
    scrolled = await act(driver, action="scroll", scroll_direction="down", scroll_amount=1)
    assert scrolled["scrollPosition"] == {"x": 0, "y": 0}
    assert await driver._eval("'abc'.slice(1).length", main_world=True) == 5000000  # the page's own
    # The world is made again for each new document.
    await act(driver, action="navigate", url=f"{site}/button.html")
    await act(driver, action="wait_for", selector="text=B", timeoutS=2)


@pytest.mark.timeout(90)
async def test_a_page_that_hangs_fails_the_verb_and_stop_loading_stops_it(
    driver: ChromiumDriver, site: str,
) -> None:
    await act(driver, action="navigate", url=f"{site}/button.html")
    driver.load_timeout_s = 1.0
    with pytest.raises(CDPTimeout, match=r"Page\.navigate: no answer from the browser within 1 s"):
        await act(driver, action="navigate", url=f"{site}/hang.html")
    stopped = await act(driver, action="stop_loading")
    assert stopped["url"] == f"{site}/button.html"
    assert await title(driver) == "button"
