"""The Chromium driver over a scripted fake browser: failures say what happened."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
import trio

from rigd.browser.cdp import CDPConnection
from rigd.browser.chromium import ChromiumDriver, PageError, open_chromium
from rigd.browser.fake import FakeTransport
from rigd.errors import Conflict, FieldError
from rigd.model import Surface
from rigd.protocols.cdp import CDPClosed
from rigd.verbs import parse_action
from rigd.verbs.base import ParseContext

SID = "S1"
Handler = Callable[[FakeTransport, dict[str, Any]], Awaitable[bool]]


class Browser:
    """Answers every command with ``{}`` unless a handler for its method says otherwise."""

    def __init__(self, fake: FakeTransport) -> None:
        self.fake = fake
        self.url = "http://site.test/"
        self.handlers: dict[str, Handler] = {}
        self.seen: list[str] = []

    async def run(self) -> None:
        while True:
            cmd = await self.fake.next_command()
            method = cmd["method"]
            self.seen.append(method)
            handler = self.handlers.get(method)
            if handler is not None and await handler(self.fake, cmd):
                continue
            await self.fake.reply(cmd, self.answer(method))

    def answer(self, method: str) -> dict[str, Any]:
        if method == "Target.getTargets":
            return {"targetInfos": [{"targetId": "T1", "type": "page"}]}
        if method == "Target.attachToTarget":
            return {"sessionId": SID}
        if method == "Page.createIsolatedWorld":
            return {"executionContextId": 7}
        if method == "Page.getNavigationHistory":
            return {"currentIndex": 0, "entries": [{"id": 1, "url": self.url, "title": "t"}]}
        return {}


@pytest.fixture
async def rig() -> AsyncIterator[tuple[ChromiumDriver, Browser]]:
    fake = FakeTransport()
    conn = CDPConnection(fake, default_timeout=5)
    browser = Browser(fake)
    async with trio.open_nursery() as nursery:
        await nursery.start(conn.run)
        nursery.start_soon(browser.run)
        async with open_chromium(conn) as driver:
            yield driver, browser
        nursery.cancel_scope.cancel()


async def act(d: ChromiumDriver, **payload: Any) -> dict[str, Any]:
    action = parse_action("browser_use", payload, ParseContext(d.viewport, Surface.BROWSER))
    assert not isinstance(action, FieldError)
    return await d.perform(action)


@pytest.mark.timeout(10)
async def test_setup_enables_domains_and_pins_the_viewport(rig: tuple[ChromiumDriver, Browser]) -> None:
    _driver, browser = rig
    for method in ("Page.enable", "Runtime.enable", "Page.setLifecycleEventsEnabled",
                   "Emulation.setDeviceMetricsOverride"):
        assert method in browser.seen


@pytest.mark.timeout(10)
async def test_a_failed_load_fails_the_verb_with_the_reason(rig: tuple[ChromiumDriver, Browser]) -> None:
    driver, browser = rig

    async def navigate(fake: FakeTransport, cmd: dict[str, Any]) -> bool:
        await fake.reply(cmd, {"frameId": "T1", "loaderId": "L1", "errorText": "net::ERR_NAME_NOT_RESOLVED"})
        return True

    browser.handlers["Page.navigate"] = navigate
    with pytest.raises(PageError, match="did not load: net::ERR_NAME_NOT_RESOLVED"):
        await act(driver, action="navigate", url="https://nowhere.test/")


@pytest.mark.timeout(10)
async def test_navigate_waits_for_its_own_load(rig: tuple[ChromiumDriver, Browser]) -> None:
    driver, browser = rig

    async def navigate(fake: FakeTransport, cmd: dict[str, Any]) -> bool:
        await fake.reply(cmd, {"frameId": "T1", "loaderId": "L2"})
        for loader in ("OLD", "L2"):
            await fake.emit("Network.responseReceived", {"loaderId": loader, "type": "Document",
                                                         "response": {"status": 201}}, SID)
        await fake.emit("Page.lifecycleEvent", {"frameId": "T1", "loaderId": "OLD", "name": "load"}, SID)
        await fake.emit("Page.lifecycleEvent", {"frameId": "T1", "loaderId": "L2", "name": "load"}, SID)
        return True

    browser.handlers["Page.navigate"] = navigate
    out = await act(driver, action="navigate", url="https://site.test/next")
    assert out["loaded"] is True and out["status"] == 201
    assert out["title"] == {"untrusted": True, "bytes": 1, "truncated": False, "text": "t"}


@pytest.mark.timeout(10)
async def test_a_crashed_renderer_fails_the_verb(rig: tuple[ChromiumDriver, Browser]) -> None:
    driver, browser = rig

    async def crash(fake: FakeTransport, cmd: dict[str, Any]) -> bool:
        await fake.emit("Inspector.targetCrashed", {}, SID)
        return True

    browser.handlers["Page.navigate"] = crash
    with pytest.raises(CDPClosed, match="renderer crashed"):
        await act(driver, action="navigate", url="https://site.test/")
    with pytest.raises(CDPClosed, match="renderer crashed"):
        await act(driver, action="screenshot")


@pytest.mark.timeout(10)
async def test_clipboard_is_refused_on_http_saying_why(rig: tuple[ChromiumDriver, Browser]) -> None:
    driver, browser = rig
    with pytest.raises(Conflict, match="plain http://, which has no Clipboard API"):
        await act(driver, action="clipboard_read")
    assert "Runtime.evaluate" not in browser.seen[-1:]


@pytest.mark.timeout(10)
async def test_history_with_nowhere_to_go_is_a_field_error(rig: tuple[ChromiumDriver, Browser]) -> None:
    driver, _browser = rig
    with pytest.raises(FieldError, match="no earlier page") as info:
        await act(driver, action="history", direction="back")
    assert info.value.field == "action.direction"


@pytest.mark.timeout(10)
async def test_dialogs_are_dismissed_and_noted(rig: tuple[ChromiumDriver, Browser]) -> None:
    driver, browser = rig
    handled = trio.Event()

    async def dialog(fake: FakeTransport, cmd: dict[str, Any]) -> bool:
        assert cmd["params"] == {"accept": False}
        await fake.reply(cmd, {})
        handled.set()
        return True

    browser.handlers["Page.handleJavaScriptDialog"] = dialog
    await browser.fake.emit("Page.javascriptDialogOpening", {"type": "alert", "message": "hi"}, SID)
    await handled.wait()
    out = await act(driver, action="extract", kind="console")
    assert out["content"]["text"] == "[dialog] alert: hi"


@pytest.mark.timeout(10)
async def test_a_profile_is_read_and_put_back_over_cdp(rig: tuple[ChromiumDriver, Browser]) -> None:
    from rigd.browser.profiles import ProfileState, parse_state

    driver, browser = rig
    sent: dict[str, list[dict[str, Any]]] = {}
    hostile_cookie = {"name": "big", "value": "x" * 10_000, "domain": "site.test"}

    def answer(method: str, result: dict[str, Any]) -> Handler:
        async def handler(fake: FakeTransport, cmd: dict[str, Any]) -> bool:
            sent.setdefault(method, []).append(cmd.get("params", {}))
            await fake.reply(cmd, result)
            return True
        return handler

    browser.handlers["Storage.getCookies"] = answer("Storage.getCookies", {"cookies": [
        {"name": "sid", "value": "v", "domain": "site.test", "path": "/", "session": True}, hostile_cookie]})
    browser.handlers["DOMStorage.getDOMStorageItems"] = answer(
        "DOMStorage.getDOMStorageItems", {"entries": [["k", "v"], ["bad"]]})
    browser.handlers["Target.getTargets"] = answer("Target.getTargets", {"targetInfos": [
        {"targetId": "T1", "type": "page", "url": "http://site.test/"},
        {"targetId": "T2", "type": "page", "url": "https://other.test/x"},
        {"targetId": "T3", "type": "page", "url": "chrome://settings"}]})
    previous = parse_state({"storage": {"http://old.test": {"a": "b"}}})
    state = await driver.export_profile(previous)
    assert state.cookies == [{"name": "sid", "value": "v", "domain": "site.test", "path": "/"}]
    assert state.tabs == ["http://site.test/", "https://other.test/x"]
    assert state.storage == {"http://old.test": {"a": "b"}, "http://site.test": {"k": "v"}}
    assert sent["DOMStorage.getDOMStorageItems"] == [
        {"storageId": {"securityOrigin": "http://site.test", "isLocalStorage": True}}]

    for method in ("Storage.setCookies", "Page.addScriptToEvaluateOnNewDocument", "Target.createTarget"):
        browser.handlers[method] = answer(method, {})
    problems = await driver.import_profile(ProfileState(state.cookies, state.tabs, state.storage))
    assert problems == []
    assert sent["Storage.setCookies"] == [{"cookies": state.cookies}]
    # Local storage goes back from a script that runs before each new document's own.
    (script,) = sent["Page.addScriptToEvaluateOnNewDocument"]
    assert json.dumps(state.storage) in script["source"] and "location.origin" in script["source"]
    # The first tab is the caller's to navigate; the rest open in the background.
    assert sent["Target.createTarget"] == [{"url": "https://other.test/x", "background": True}]


@pytest.mark.timeout(10)
async def test_the_driver_waits_for_the_browsers_own_first_tab() -> None:
    """Chromium answers DevTools before it has made the tab its command line asked for: the
    driver waits for that tab instead of making (and driving) a blank one of its own."""
    fake = FakeTransport()
    conn = CDPConnection(fake, default_timeout=5)
    browser = Browser(fake)
    asked = 0

    async def no_tab_yet(fake: FakeTransport, cmd: dict[str, Any]) -> bool:
        nonlocal asked
        asked += 1
        tabs = [{"targetId": "START", "type": "page"}] if asked >= 3 else [
            {"targetId": "W1", "type": "service_worker"}]
        await fake.reply(cmd, {"targetInfos": tabs})
        return True

    browser.handlers["Target.getTargets"] = no_tab_yet
    async with trio.open_nursery() as nursery:
        await nursery.start(conn.run)
        nursery.start_soon(browser.run)
        async with open_chromium(conn) as driver:
            assert driver.target_id == "START"
        nursery.cancel_scope.cancel()
    assert asked == 3
    assert "Target.createTarget" not in browser.seen


@pytest.mark.timeout(10)
async def test_a_browser_without_a_tab_gets_a_blank_one_after_the_wait() -> None:
    fake = FakeTransport()
    conn = CDPConnection(fake, default_timeout=5)
    browser = Browser(fake)

    async def none(fake: FakeTransport, cmd: dict[str, Any]) -> bool:
        await fake.reply(cmd, {"targetInfos": []})
        return True

    async def create(fake: FakeTransport, cmd: dict[str, Any]) -> bool:
        assert cmd["params"] == {"url": "about:blank"}
        await fake.reply(cmd, {"targetId": "NEW"})
        return True

    browser.handlers["Target.getTargets"] = none
    browser.handlers["Target.createTarget"] = create
    async with trio.open_nursery() as nursery:
        await nursery.start(conn.run)
        nursery.start_soon(browser.run)
        async with open_chromium(conn, first_tab_s=0.3) as driver:
            assert driver.target_id == "NEW"
        nursery.cancel_scope.cancel()
    assert browser.seen.count("Target.getTargets") >= 2
