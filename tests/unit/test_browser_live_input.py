"""A person's live-view input replayed on a headless page, and screencast frames (pure)."""

from __future__ import annotations

import base64
import io

import pytest
from PIL import Image

from rigd.browser.live_input import PointerState, Sleep, plan_cdp
from rigd.errors import FieldError, RigdError
from rigd.protocols import input as qin
from rigd.protocols.devtools import MAX_CAST_BYTES, parse_cast_frame
from rigd.server.live import plan_input

VIEW = (1280, 800)


def _plan(*msgs: dict[str, object], state: PointerState | None = None) -> tuple[list[object], PointerState]:
    steps: list[qin.Step] = []
    for msg in msgs:
        steps += plan_input(msg, VIEW)[0]
    cmds, after = plan_cdp(steps, VIEW, state or PointerState())
    return list(cmds), after


def test_a_click_lands_on_the_css_pixel_the_person_pointed_at() -> None:
    for x, y in ((0, 0), (1, 1), (640, 123), (1279, 799)):
        cmds, after = _plan({"type": "button", "button": "left", "down": True, "x": x, "y": y},
                            {"type": "button", "button": "left", "down": False})
        moved, pressed, released = cmds
        assert moved == ("Input.dispatchMouseEvent", {"type": "mouseMoved", "x": x, "y": y, "buttons": 0,
                                                      "modifiers": 0, "button": "none"})
        assert pressed[1]["type"] == "mousePressed" and pressed[1]["buttons"] == 1  # type: ignore[index]
        assert (pressed[1]["x"], pressed[1]["y"], pressed[1]["button"]) == (x, y, "left")  # type: ignore[index]
        assert released[1]["type"] == "mouseReleased" and released[1]["buttons"] == 0  # type: ignore[index]
        assert (after.x, after.y, after.buttons) == (x, y, 0)


def test_a_drag_moves_with_the_button_held() -> None:
    state = PointerState(10, 10, buttons=1)
    cmds, after = _plan({"type": "move", "x": 300, "y": 200}, state=state)
    assert cmds == [("Input.dispatchMouseEvent", {"type": "mouseMoved", "x": 300, "y": 200, "buttons": 1,
                                                  "modifiers": 0, "button": "left"})]
    assert after.buttons == 1


def test_wheel_notches_scroll_at_the_pointer() -> None:
    cmds, _ = _plan({"type": "wheel", "direction": "down", "amount": 3}, state=PointerState(50, 60))
    wheels = [c for c in cmds if not isinstance(c, Sleep) and c[1]["type"] == "mouseWheel"]
    assert len(wheels) == 3 and all(c[1]["deltaY"] == 100 and c[1]["x"] == 50 for c in wheels)  # type: ignore[index]


def test_text_is_inserted_and_keys_follow_held_modifiers() -> None:
    cmds, after = _plan({"type": "text", "text": "Grüße 世界"})
    assert cmds == [("Input.insertText", {"text": "Grüße 世界"})]
    cmds, after = _plan({"type": "key", "key": "Control_L", "down": True},
                        {"type": "key", "key": "a", "down": True}, {"type": "key", "key": "a", "down": False},
                        {"type": "key", "key": "Control_L", "down": False})
    ctrl_down, a_down, a_up, ctrl_up = (c[1] for c in cmds)  # type: ignore[index]
    assert ctrl_down["type"] == "rawKeyDown" and ctrl_down["modifiers"] == 2 and ctrl_down["key"] == "Control"
    # A shortcut types nothing.
    assert a_down == {"type": "rawKeyDown", "modifiers": 2, "key": "a", "code": "KeyA",
                      "windowsVirtualKeyCode": 65, "location": 0}
    assert a_up["type"] == "keyUp" and ctrl_up["modifiers"] == 0 and after.modifiers == 0
    cmds, _ = _plan({"type": "key", "key": "Return", "down": True})
    assert cmds[0][1]["type"] == "keyDown" and cmds[0][1]["text"] == "\r"  # type: ignore[index]
    cmds, _ = _plan({"type": "key", "key": "Shift_L", "down": True}, {"type": "key", "key": "Tab", "down": True})
    assert cmds[1][1]["modifiers"] == 8 and cmds[1][1]["key"] == "Tab"  # type: ignore[index]


def test_what_a_page_cannot_take_is_a_field_error() -> None:
    with pytest.raises(FieldError) as exc:
        plan_cdp([[{"type": "key", "data": {"down": True, "key": {"type": "qcode", "data": "lang1"}}}]],
                 VIEW, PointerState())
    assert exc.value.field == "key"
    with pytest.raises(FieldError):
        plan_cdp([qin.Bind(((200, 0x4E16),), 0)], VIEW, PointerState())
    with pytest.raises(FieldError):
        plan_cdp([[{"type": "rel", "data": {"axis": "x", "value": 3}}]], VIEW, PointerState())


def _jpeg(w: int, h: int) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (w, h), (10, 20, 30)).save(out, "JPEG")
    return out.getvalue()


def test_a_screencast_frame_is_checked_and_sized_from_the_jpeg_itself() -> None:
    data = _jpeg(64, 40)
    frame = parse_cast_frame({"data": base64.b64encode(data).decode(), "sessionId": 7,
                              "metadata": {"deviceWidth": 9999}})
    assert (frame.width, frame.height, frame.ack, frame.data) == (64, 40, 7, data)
    png = io.BytesIO()
    Image.new("RGB", (4, 4)).save(png, "PNG")
    for bad in ({"data": base64.b64encode(data).decode()},
                {"data": base64.b64encode(data).decode(), "sessionId": True},
                {"data": "!!!not base64", "sessionId": 1},
                {"data": base64.b64encode(b"\xff\xd8junk").decode(), "sessionId": 1},
                {"data": base64.b64encode(png.getvalue()).decode(), "sessionId": 1},
                {"data": "A" * (MAX_CAST_BYTES * 2), "sessionId": 1}):
        with pytest.raises(RigdError):
            parse_cast_frame(bad)  # type: ignore[arg-type]
