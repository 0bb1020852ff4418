"""The Chromium driver's pure parts: key plans, reply readers, the a11y rendering, console lines."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rigd.browser.cdp_replies import (
    AXNode,
    console_line,
    document_status,
    parse_ax_tree,
    parse_history,
    parse_navigate,
    parse_value,
    render_ax,
)
from rigd.browser.dom_keys import plan_press
from rigd.browser.page import selector_engine
from rigd.errors import FieldError
from rigd.protocols.cdp import CDPError, CDPProtocolError, Event, read
from rigd.verbs.keys import parse_dom_combo


def _keys(combo: str) -> list[tuple[str, str, int, str | None]]:
    return [(e["type"], e["key"], e["modifiers"], e.get("text")) for e in plan_press(parse_dom_combo(combo))]


def test_enter_types_a_carriage_return() -> None:
    assert _keys("Enter") == [("keyDown", "Enter", 0, "\r"), ("keyUp", "Enter", 0, None)]
    assert plan_press(parse_dom_combo("Enter"))[0]["windowsVirtualKeyCode"] == 13


def test_shift_gives_the_shifted_key_and_modifiers_wrap_the_press() -> None:
    assert _keys("Shift+KeyA") == [
        ("rawKeyDown", "Shift", 8, None), ("keyDown", "A", 8, "A"), ("keyUp", "A", 8, None),
        ("keyUp", "Shift", 0, None),
    ]
    assert _keys("Shift+Digit1")[1] == ("keyDown", "!", 8, "!")


def test_control_combos_are_shortcuts_without_text() -> None:
    events = plan_press(parse_dom_combo("Control+a"))
    assert [(e["type"], e["key"], e["modifiers"]) for e in events] == [
        ("rawKeyDown", "Control", 2), ("rawKeyDown", "a", 2), ("keyUp", "a", 2), ("keyUp", "Control", 0),
    ]
    assert events[1]["code"] == "KeyA" and "text" not in events[1]
    assert plan_press(parse_dom_combo("ControlOrMeta+c"))[0]["key"] == "Control"


def test_characters_and_keypad() -> None:
    assert _keys("!")[0] == ("keyDown", "!", 0, "!")
    assert plan_press(parse_dom_combo("!"))[0]["code"] == "Digit1"
    assert _keys("é")[0] == ("keyDown", "é", 0, "é")
    pad = plan_press(parse_dom_combo("Numpad5"))[0]
    assert pad["isKeypad"] is True and pad["location"] == 3 and pad["key"] == "5"
    assert _keys("ArrowLeft") == [("rawKeyDown", "ArrowLeft", 0, None), ("keyUp", "ArrowLeft", 0, None)]


def test_history_reply_is_checked() -> None:
    good = {"currentIndex": 1, "entries": [{"id": 1, "url": "about:blank", "title": ""},
                                           {"id": 5, "url": "https://a.test/", "title": "A"}]}
    history = read(good, "Page.getNavigationHistory", parse_history)
    assert history.entry.url == "https://a.test/" and history.current == 1
    with pytest.raises(CDPProtocolError, match=r"currentIndex is not an integer in 0\.\.1"):
        read({**good, "currentIndex": 7}, "Page.getNavigationHistory", parse_history)
    with pytest.raises(CDPProtocolError, match=r"entries\[0\]: url is not a string"):
        read({"currentIndex": 0, "entries": [{"id": 1}]}, "Page.getNavigationHistory", parse_history)


def test_navigate_reply() -> None:
    nav = read({"frameId": "F", "loaderId": "L", "errorText": "net::ERR_NAME_NOT_RESOLVED"},
               "Page.navigate", parse_navigate)
    assert (nav.loader_id, nav.error_text) == ("L", "net::ERR_NAME_NOT_RESOLVED")
    assert read({"frameId": "F"}, "Page.navigate", parse_navigate).loader_id is None


def test_evaluate_reply_and_thrown_exceptions() -> None:
    assert read({"result": {"type": "number", "value": 3}}, "Runtime.evaluate", parse_value) == 3
    with pytest.raises(CDPError, match="TypeError: boom"):
        read({"result": {}, "exceptionDetails": {"text": "Uncaught", "exception": {
            "description": "TypeError: boom"}}}, "Runtime.evaluate", parse_value)


def _ax(node_id: str, role: str, name: str = "", parent: str | None = None,
        children: tuple[str, ...] = (), ignored: bool = False) -> AXNode:
    return AXNode(node_id, parent, ignored, role, name, "", children)


def test_a11y_render_skips_ignored_and_unnamed_generics() -> None:
    nodes = [
        _ax("1", "RootWebArea", "Page", children=("2",)),
        _ax("2", "generic", parent="1", children=("3", "4")),
        _ax("3", "heading", "Title", parent="2", children=("5",)),
        _ax("4", "button", "Go", parent="2", ignored=True, children=("6",)),
        _ax("5", "StaticText", "Title", parent="3", children=("7",)),
        _ax("6", "StaticText", "Go", parent="4"),
        _ax("7", "InlineTextBox", "Title", parent="5"),
    ]
    assert render_ax(nodes) == '\n'.join([
        'RootWebArea "Page"', '  heading "Title"', '    StaticText "Title"', '  StaticText "Go"',
    ])


def test_a11y_render_survives_cycles_and_depth() -> None:
    cyclic = [_ax("1", "list", "a", parent="2", children=("2",)), _ax("2", "list", "b", parent="1",
                                                                      children=("1",))]
    assert render_ax(cyclic) == ""  # no root: nothing to show, and no hang
    deep = [_ax(str(i), "group", str(i), parent=str(i - 1) if i else None, children=(str(i + 1),))
            for i in range(5000)]
    assert len(render_ax(deep).splitlines()) == 5000


def test_ax_tree_reply_is_bounded_and_typed() -> None:
    reply = {"nodes": [{"nodeId": "1", "ignored": False, "role": {"type": "role", "value": "button"},
                        "name": {"type": "computedString", "value": "OK"}, "childIds": ["2", 5]}]}
    (node,) = read(reply, "Accessibility.getFullAXTree", parse_ax_tree)
    assert (node.role, node.name, node.children) == ("button", "OK", ("2",))
    with pytest.raises(CDPProtocolError, match="nodeId is not a string"):
        read({"nodes": [{"nodeId": 1}]}, "Accessibility.getFullAXTree", parse_ax_tree)


def test_console_lines_are_bounded() -> None:
    line = console_line(Event("Runtime.consoleAPICalled", "S", {
        "type": "log", "args": [{"type": "string", "value": "hi"}, {"type": "number", "value": 42},
                                {"type": "object", "description": "Object"}]}))
    assert line == "[log] hi 42 Object"
    long = console_line(Event("Runtime.consoleAPICalled", "S", {"type": "log",
                                                                 "args": [{"value": "x" * 5000}]}))
    assert len(long) < 2100 and "characters cut" in long
    exc = console_line(Event("Runtime.exceptionThrown", "S", {"exceptionDetails": {
        "text": "Uncaught", "exception": {"description": "Error: late"}}}))
    assert exc == "[exception] Error: late"


@given(st.dictionaries(st.sampled_from(["type", "args", "exceptionDetails", "message"]),
                       st.recursive(st.none() | st.integers() | st.text(max_size=5),
                                    lambda kids: st.lists(kids, max_size=3)
                                    | st.dictionaries(st.text(max_size=5), kids, max_size=3),
                                    max_leaves=10)))
def test_console_line_never_raises(params: dict[str, Any]) -> None:
    for method in ("Runtime.consoleAPICalled", "Runtime.exceptionThrown", "dialog"):
        console_line(Event(method, None, params))


def test_selector_engines() -> None:
    assert selector_engine("button#go") == ("css", "button#go")
    assert selector_engine("a[href='x=y']") == ("css", "a[href='x=y']")
    assert selector_engine("css=div > p") == ("css", "div > p")
    assert selector_engine("text=Sign in") == ("text", "Sign in")
    assert selector_engine('"Sign in"') == ("text", '"Sign in"')
    assert selector_engine("//div[@id='x']") == ("xpath", "//div[@id='x']")
    assert selector_engine("xpath=//p") == ("xpath", "//p")
    assert selector_engine("data-testid=go") == ("data-testid", "go")
    for bad, says in [("role=button", "role= engine is not supported"),
                      ("div >> text=x", "chained selectors"), ("text=", "no selector after")]:
        with pytest.raises(FieldError, match=says) as info:
            selector_engine(bad)
        assert info.value.field == "action.selector"


def test_document_status_matches_the_loader() -> None:
    events = [Event("Network.responseReceived", "S", {"loaderId": "L", "type": "Image",
                                                      "response": {"status": 500}}),
              Event("Network.responseReceived", "S", {"loaderId": "L", "type": "Document",
                                                      "response": {"status": 404}})]
    assert document_status(events, "L") == 404
    assert document_status(events, "M") is None
