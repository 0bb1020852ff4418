"""Vocabularies (rigd.dialects, pure): each vendor's computer calls as rigd actions,
the one key table, the screenshot's coordinate frame, the tool definitions and the
results rendered back."""

from __future__ import annotations

import base64
import io
from typing import Any

import pytest
from PIL import Image

from rigd.errors import BackendError, FieldError
from rigd.model import Display
from rigd.tools.catalogue import definitions as openai_definitions
from rigd.tools.dialects import (
    ANTHROPIC_ACTIONS,
    GEMINI_ACTIONS,
    OPENAI_ACTIONS,
    Call,
    Dialect,
    Frame,
    definitions,
    parse_dialect,
    render,
    translate,
)
from rigd.verbs.keys import KeySyntaxError, combo_for, modifiers_for, rig_key

BIG = Frame.of(Display(2560, 1600))  # a downscaled display: scale 2
SAME = Frame.of(Display(1280, 800))  # shown as it is: scale 1


def plan(dialect: Dialect, name: str, args: dict[str, Any], frame: Frame = BIG) -> list[dict[str, Any]]:
    call = translate(dialect, name, args)
    assert call is not None
    return [p.action for p in call.plan(frame) if p.action is not None]


def refused(dialect: Dialect, name: str, args: object, frame: Frame = BIG) -> FieldError:
    with pytest.raises(FieldError) as exc:
        call = translate(dialect, name, args)
        assert call is not None
        call.plan(frame)
    return exc.value


# --- the key table -----------------------------------------------------------------------


@pytest.mark.parametrize(("spellings", "x11", "dom"), [
    (["Return", "ENTER", "Enter", "enter", "return"], "Return", "Enter"),
    (["ctrl", "CTRL", "Control", "control_l", "ControlLeft"], "Control_L", "Control"),
    (["Left", "ARROWLEFT", "ArrowLeft", "left"], "Left", "ArrowLeft"),
    (["Next", "Page_Down", "PAGEDOWN", "PageDown", "pgdn"], "Next", "PageDown"),
    (["BackSpace", "BACKSPACE", "Backspace"], "BackSpace", "Backspace"),
    (["Escape", "ESC", "esc"], "Escape", "Escape"),
    (["super", "CMD", "META", "Meta", "win"], "Super_L", "Meta"),
    (["space", "SPACE", " ", "Space"], "space", "Space"),
    (["Delete", "DELETE", "del"], "Delete", "Delete"),
    (["alt", "ALT", "Alt", "option"], "Alt_L", "Alt"),
    (["Tab", "TAB", "tab"], "Tab", "Tab"),
    (["F5", "f5"], "F5", "F5"),
    (["a", "KeyA"], "a", "a"),
    (["+", "plus"], "plus", "+"),
])
def test_every_vocabulary_spells_the_same_rig_key(spellings: list[str], x11: str, dom: str) -> None:
    for name in spellings:
        key = rig_key(name)
        assert key is not None, name
        assert (key.x11, key.dom) == (x11, dom), name


def test_combos_in_any_vocabulary_become_the_targets_syntax() -> None:
    assert combo_for(["CTRL", "A"], "x11") == "Control_L+a"  # xdotool would add Shift to 'A'
    assert combo_for(["CTRL", "A"], "dom") == "Control+A"
    assert combo_for(["Control", "Shift", "T"], "x11") == "Control_L+Shift_L+t"
    assert combo_for(["ctrl", "s"], "dom") == "Control+s"
    assert combo_for(["Return"], "dom") == "Enter"
    assert combo_for(["ENTER"], "x11") == "Return"
    assert combo_for(["XF86AudioMute"], "x11") == "XF86AudioMute"  # a keysym the table lacks passes
    assert combo_for(["NumpadAdd"], "dom") == "NumpadAdd"
    assert combo_for(["SHIFT"], "x11") == "Shift_L"  # a modifier alone is a key press
    assert modifiers_for(["CTRL", "shift"], "x11") == "Control_L+Shift_L"


@pytest.mark.parametrize(("names", "target", "words"), [
    (["A", "CTRL"], "x11", "not a modifier"),
    (["Foo"], "dom", "not a key name"),
    (["esc!"], "x11", "not a key name"),
    ([], "x11", "at least one key"),
    (["Control", "Retrun"], "dom", "not a key name"),
])
def test_a_bad_combo_says_which_name(names: list[str], target: str, words: str) -> None:
    with pytest.raises(KeySyntaxError) as exc:
        combo_for(names, target)
    assert words in str(exc.value)
    with pytest.raises(KeySyntaxError, match="not a modifier"):
        modifiers_for(["a"], "x11")


# --- the frame -------------------------------------------------------------------------------


def test_a_downscaled_display_maps_image_points_back_to_display_points() -> None:
    assert (BIG.image, BIG.scale) == (Display(1280, 800), 2.0)
    assert BIG.to_display(640, 400, "c") == [1280, 800]
    assert BIG.to_image(1280, 800) == (640, 400)
    assert BIG.to_display(1279, 799, "c") == [2558, 1598]
    wide = Frame.of(Display(1920, 1080))
    assert (wide.image, wide.scale) == (Display(1280, 720), 1.5)
    assert wide.to_display(1279, 719, "c") == [1919, 1079]  # inside the display, never past it
    assert SAME.to_display(640, 400, "c") == [640, 400] and SAME.scale == 1.0
    assert BIG.from_grid(500, 500) == [1280, 800] and BIG.from_grid(999, 0) == [2557, 0]


@pytest.mark.parametrize(("x", "y"), [(1280, 0), (0, 800), (-1, 5), (5000, 5000)])
def test_a_point_outside_the_screenshot_is_refused_not_clamped(x: int, y: int) -> None:
    err = refused(Dialect.ANTHROPIC, "computer", {"action": "left_click", "coordinate": [x, y]})
    assert err.field == "arguments.coordinate" and "outside the screenshot" in err.reason
    assert "1280x800" in err.reason
    err = refused(Dialect.OPENAI_COMPUTER, "computer", {"action": {"type": "move", "x": x, "y": y}}, SAME)
    assert err.field == ("arguments.action.x" if not 0 <= x < 1280 else "arguments.action.y")


# --- anthropic -------------------------------------------------------------------------------

ANTHROPIC_CASES: dict[str, tuple[dict[str, Any], list[dict[str, Any]]]] = {
    "screenshot": ({}, []),
    "cursor_position": ({}, [{"action": "cursor_position"}]),
    "mouse_move": ({"coordinate": [640, 400]}, [{"action": "mouse_move", "coordinate": [1280, 800]}]),
    "left_click": ({"coordinate": [10, 20], "text": "shift"},
                   [{"action": "left_click", "coordinate": [20, 40], "text": "Shift_L"}]),
    "right_click": ({"coordinate": [10, 20]}, [{"action": "right_click", "coordinate": [20, 40]}]),
    "middle_click": ({}, [{"action": "middle_click"}]),
    "double_click": ({"coordinate": [1, 1], "text": "ctrl+alt"},
                     [{"action": "double_click", "coordinate": [2, 2], "text": "Control_L+Alt_L"}]),
    "triple_click": ({"coordinate": [1, 1]}, [{"action": "triple_click", "coordinate": [2, 2]}]),
    "left_mouse_down": ({"coordinate": [5, 5]}, [{"action": "mouse_move", "coordinate": [10, 10]},
                                                 {"action": "left_mouse_down"}]),
    "left_mouse_up": ({}, [{"action": "left_mouse_up"}]),
    "left_click_drag": ({"start_coordinate": [1, 2], "coordinate": [3, 4]},
                        [{"action": "left_click_drag", "start_coordinate": [2, 4], "coordinate": [6, 8]}]),
    "scroll": ({"coordinate": [1, 2], "scroll_direction": "down", "scroll_amount": 3, "text": "shift"},
               [{"action": "scroll", "scroll_direction": "down", "scroll_amount": 3, "coordinate": [2, 4],
                 "text": "Shift_L"}]),
    "key": ({"text": "ctrl+s Return cmd+ENTER"}, [{"action": "key", "text": "Control_L+s Return Super_L+Return"}]),
    "hold_key": ({"text": "shift", "duration": 1}, [{"action": "hold_key", "text": "Shift_L", "duration": 1}]),
    "type": ({"text": "héllo"}, [{"action": "type", "text": "héllo"}]),
    "wait": ({"duration": 0.5}, [{"action": "wait", "duration": 0.5}]),
    "zoom": ({"region": [0, 0, 640, 400]}, []),
}


def test_every_anthropic_action_has_a_case() -> None:
    assert sorted(ANTHROPIC_CASES) == sorted(ANTHROPIC_ACTIONS)


@pytest.mark.parametrize("verb", ANTHROPIC_ACTIONS)
def test_anthropic_actions_become_computer_use_actions_then_a_screenshot(verb: str) -> None:
    args, expected = ANTHROPIC_CASES[verb]
    call = translate(Dialect.ANTHROPIC, "computer", {"action": verb, **args, "rigId": "rig_1"})
    assert call is not None and call.rig_id == "rig_1" and call.surface == "computer"
    actions = [p.action for p in call.plan(BIG)]
    # zoom's observation is computer_use's zoom (the region in display pixels: scale 2 here).
    tail = ([] if verb == "cursor_position" else [{"action": "zoom", "region": [0, 0, 1280, 800]}]
            if verb == "zoom" else [{"action": "screenshot"}])
    assert actions == expected + tail


@pytest.mark.parametrize(("args", "field", "words"), [
    ({"action": "left_click", "x": 1, "y": 2}, "arguments.x", "coordinate: [x, y]"),
    ({"type": "click", "x": 1}, "arguments.type", "names its action in action"),
    ({"action": "fly"}, "arguments.action", "'fly' is not an action"),
    ({}, "arguments.action", "missing is not an action"),
    ({"action": "left_click", "coordinate": [1.5, 2]}, "arguments.coordinate", "two integers"),
    ({"action": "left_click", "coordinate": [1, 2, 3]}, "arguments.coordinate", "[x, y]"),
    ({"action": "left_click", "text": "a"}, "arguments.text", "not a modifier"),
    ({"action": "type", "coordinate": [1, 1], "text": "x"}, "arguments.coordinate", "not a field of the type"),
    ({"action": "key", "text": "ctrl+"}, "arguments.text", "empty key name"),
    ({"action": "scroll", "scroll_direction": "sideways", "scroll_amount": 1}, "arguments.scroll_direction",
     "must be one of"),
    ({"action": "scroll", "scroll_direction": "up", "scroll_amount": 1000}, "arguments.scroll_amount",
     "between"),
    ({"action": "wait"}, "arguments.duration", ""),
    ({"action": "zoom", "region": [10, 10, 5, 20]}, "arguments.region", "x1 < x2"),
    ({"action": "zoom", "region": [0, 0, 1281, 10]}, "arguments.region", "outside the 1280x800"),
    ({"action": "zoom"}, "arguments.region", "[x1, y1, x2, y2]"),
    ({"action": "screenshot", "rigId": 5}, "arguments.rigId", "rig id"),
])
def test_anthropic_bad_shapes_name_the_field(args: dict[str, Any], field: str, words: str) -> None:
    err = refused(Dialect.ANTHROPIC, "computer", args)
    assert err.field == field and words in err.reason, (err.field, err.reason)


# --- openai-computer -------------------------------------------------------------------------

OPENAI_CASES: dict[str, tuple[dict[str, Any], list[dict[str, Any]]]] = {
    "click": ({"button": "right", "x": 10, "y": 20, "keys": ["CTRL"]},
              [{"action": "right_click", "coordinate": [20, 40], "text": "Control_L"}]),
    "double_click": ({"x": 10, "y": 20, "keys": None}, [{"action": "double_click", "coordinate": [20, 40]}]),
    "drag": ({"path": [{"x": 1, "y": 1}, {"x": 5, "y": 5}]},
             [{"action": "left_click_drag", "start_coordinate": [2, 2], "coordinate": [10, 10]}]),
    "keypress": ({"keys": ["CTRL", "SHIFT", "T"]}, [{"action": "key", "text": "Control_L+Shift_L+t"}]),
    "move": ({"x": 640, "y": 400}, [{"action": "mouse_move", "coordinate": [1280, 800]}]),
    "scroll": ({"x": 5, "y": 5, "scroll_x": 0, "scroll_y": 300},
               [{"action": "scroll", "coordinate": [10, 10], "scroll_direction": "down", "scroll_amount": 6}]),
    "type": ({"text": "hi"}, [{"action": "type", "text": "hi"}]),
    "wait": ({}, [{"action": "wait", "duration": 2.0}]),
    "screenshot": ({}, []),
}


def test_every_openai_action_has_a_case() -> None:
    assert sorted(OPENAI_CASES) == sorted(OPENAI_ACTIONS)


@pytest.mark.parametrize("kind", OPENAI_ACTIONS)
def test_openai_actions_become_computer_use_actions_then_a_screenshot(kind: str) -> None:
    args, expected = OPENAI_CASES[kind]
    assert plan(Dialect.OPENAI_COMPUTER, "computer", {"action": {"type": kind, **args}}) == \
        [*expected, {"action": "screenshot"}]


def test_several_openai_actions_run_in_order_with_one_screenshot_after_them() -> None:
    actions = plan(Dialect.OPENAI_COMPUTER, "computer", {"actions": [
        {"type": "click", "button": "left", "x": 100, "y": 50},
        {"type": "type", "text": "rigd"},
        {"type": "keypress", "keys": ["ENTER"]},
        {"type": "scroll", "x": 0, "y": 0, "scroll_x": -150, "scroll_y": 0},
        {"type": "drag", "path": [{"x": 1, "y": 1}, {"x": 2, "y": 2}, {"x": 3, "y": 3}]},
        {"type": "click", "button": "wheel", "x": 1, "y": 1},
    ]})
    assert actions == [
        {"action": "left_click", "coordinate": [200, 100]},
        {"action": "type", "text": "rigd"},
        {"action": "key", "text": "Return"},
        {"action": "scroll", "coordinate": [0, 0], "scroll_direction": "left", "scroll_amount": 3},
        {"action": "mouse_move", "coordinate": [2, 2]}, {"action": "left_mouse_down"},
        {"action": "mouse_move", "coordinate": [4, 4]}, {"action": "mouse_move", "coordinate": [6, 6]},
        {"action": "left_mouse_up"},
        {"action": "middle_click", "coordinate": [2, 2]},
        {"action": "screenshot"},
    ]
    assert [a["action"] for a in plan(Dialect.OPENAI_COMPUTER, "computer", {"action": {
        "type": "scroll", "x": 0, "y": 0, "scroll_x": 100, "scroll_y": 100}})] == ["scroll", "scroll", "screenshot"]


@pytest.mark.parametrize(("args", "field", "words"), [
    ({"action": "click"}, "arguments.action", "must be an object"),
    ({"action": {"type": "click"}, "actions": []}, "arguments", "action (one computer action) or actions"),
    ({}, "arguments", "or actions"),
    ({"actions": []}, "arguments.actions", "1 to 50"),
    ({"actions": [{"type": "wait"}] * 51}, "arguments.actions", "1 to 50"),
    ({"coordinate": [1, 2]}, "arguments.coordinate", "take x and y"),
    ({"action": {"action": "left_click", "coordinate": [1, 1]}}, "arguments.action.action",
     "an object with a type"),
    ({"action": {"type": "click", "coordinate": [1, 1]}}, "arguments.action.coordinate", "take x and y"),
    ({"action": {"type": "tap", "x": 1, "y": 1}}, "arguments.action.type", "'tap' is not a computer action"),
    ({"action": {"type": "click", "button": "back", "x": 1, "y": 1}}, "arguments.action.button",
     "not on a rig's desktop"),
    ({"action": {"type": "click", "button": ["left"], "x": 1, "y": 1}}, "arguments.action.button",
     "must be left"),
    ({"action": {"type": "move", "x": 1, "y": 1, "keys": ["SHIFT"]}}, "arguments.action.keys", "not supported"),
    ({"action": {"type": "click", "x": 1, "y": 1, "keys": ["A"]}}, "arguments.action.keys", "not a modifier"),
    ({"action": {"type": "keypress", "keys": ["A", "B"]}}, "arguments.action.keys", "not a modifier"),
    ({"action": {"type": "keypress", "keys": "CTRL+A"}}, "arguments.action.keys", "list"),
    ({"action": {"type": "click", "x": True, "y": 1}}, "arguments.action.x", "integer"),
    ({"action": {"type": "drag", "path": [{"x": 1, "y": 1}]}}, "arguments.action.path", "2 to 100"),
    ({"action": {"type": "drag", "path": [{"x": 1, "y": 1}, {"x": 1, "z": 1}]}},
     "arguments.action.path[1].z", "not a field of a path point"),
    ({"action": {"type": "scroll", "x": 1, "y": 1, "scroll_y": 999999}}, "arguments.action.scroll_y",
     "at most 100"),
    ({"actions": [{"type": "wait"}, {"type": "click", "x": 1, "y": 9999}]}, "arguments.actions[1].y",
     "outside the screenshot"),
    ({"action": {"type": "type", "text": ""}}, "arguments.action.text", "empty"),
])
def test_openai_bad_shapes_name_the_field(args: dict[str, Any], field: str, words: str) -> None:
    err = refused(Dialect.OPENAI_COMPUTER, "computer", args)
    assert err.field == field and words in err.reason, (err.field, err.reason)


# --- gemini ----------------------------------------------------------------------------------

GEMINI_CASES: dict[str, tuple[dict[str, Any], list[dict[str, Any] | None]]] = {
    "open_web_browser": ({}, []),
    "wait_5_seconds": ({}, [None]),
    "go_back": ({}, [{"action": "history", "direction": "back"}]),
    "go_forward": ({}, [{"action": "history", "direction": "forward"}]),
    "search": ({}, [{"action": "navigate", "url": "https://www.google.com/"}]),
    "navigate": ({"url": "wikipedia.org"}, [{"action": "navigate", "url": "https://wikipedia.org"}]),
    "click_at": ({"x": 500, "y": 250}, [{"action": "click", "coordinate": [640, 200]}]),
    "hover_at": ({"x": 0, "y": 999}, [{"action": "mouse_move", "coordinate": [0, 799]}]),
    "type_text_at": ({"x": 500, "y": 500, "text": "rigd", "safety_decision": {"decision": "ok"}}, [
        {"action": "click", "coordinate": [640, 400]}, {"action": "key", "text": "ControlOrMeta+a"},
        {"action": "key", "text": "Delete"}, {"action": "type", "text": "rigd"}, {"action": "key", "text": "Enter"}]),
    "key_combination": ({"keys": "control+shift+t"}, [{"action": "key", "text": "Control+Shift+t"}]),
    "scroll_document": ({"direction": "down"}, [{"action": "key", "text": "PageDown"}]),
    "scroll_at": ({"x": 500, "y": 500, "direction": "up", "magnitude": 500},
                  [{"action": "scroll", "coordinate": [640, 400], "scroll_direction": "up", "scroll_amount": 4}]),
    "drag_and_drop": ({"x": 0, "y": 0, "destination_x": 500, "destination_y": 500},
                      [{"action": "drag", "start_coordinate": [0, 0], "coordinate": [640, 400]}]),
}


def test_every_gemini_action_has_a_case() -> None:
    assert sorted(GEMINI_CASES) == sorted(GEMINI_ACTIONS)


@pytest.mark.parametrize("name", GEMINI_ACTIONS)
def test_gemini_actions_become_browser_use_actions_then_a_screenshot(name: str) -> None:
    args, expected = GEMINI_CASES[name]
    call = translate(Dialect.GEMINI, name, args)
    assert call is not None and call.surface == "browser"
    steps = call.plan(SAME)
    assert [p.action for p in steps] == [*expected, {"action": "screenshot"}]
    if name == "wait_5_seconds":
        assert steps[0].sleep_s == 5.0


def test_gemini_type_text_at_can_keep_the_field_and_skip_enter() -> None:
    assert plan(Dialect.GEMINI, "type_text_at", {"x": 1, "y": 1, "text": "a", "press_enter": False,
                                                 "clear_before_typing": False}, SAME) == [
        {"action": "click", "coordinate": [1, 0]}, {"action": "type", "text": "a"}, {"action": "screenshot"}]


@pytest.mark.parametrize(("name", "args", "field", "words"), [
    ("click_at", {"x": 1000, "y": 5}, "arguments.x", "between 0 and 999"),
    ("click_at", {"x": 5}, "arguments.y", "required"),
    ("click_at", {"coordinate": [1, 2]}, "arguments.coordinate", "take x and y, 0-999"),
    ("scroll_at", {"x": 1, "y": 1, "direction": "north"}, "arguments.direction", "up, down"),
    ("key_combination", {"keys": "Control+Retrun"}, "arguments.keys", "not a key name"),
    ("key_combination", {"keys": "Control+a Enter"}, "arguments.keys", "one combination"),
    ("navigate", {"url": "ftp://x.test/"}, "arguments.url", "http"),
    ("type_text_at", {"x": 1, "y": 1, "text": "a", "press_enter": "yes"}, "arguments.press_enter", "true or false"),
    ("fly", {}, "name", "not a tool of the gemini dialect"),
])
def test_gemini_bad_shapes_name_the_field(name: str, args: dict[str, Any], field: str, words: str) -> None:
    err = refused(Dialect.GEMINI, name, args)
    assert err.field == field and words in err.reason, (err.field, err.reason)


def test_dialect_names_and_each_dialects_tools() -> None:
    assert parse_dialect(None) is Dialect.OPENAI and parse_dialect("gemini") is Dialect.GEMINI
    for bad in ("claude", 3, ""):
        with pytest.raises(FieldError) as exc:
            parse_dialect(bad)
        assert exc.value.field == "dialect" and "openai-computer" in exc.value.reason
    assert translate(Dialect.ANTHROPIC, "terminal_use", {}) is None  # rigd's own tool, served as is
    for dialect, name in ((Dialect.ANTHROPIC, "computer_use"), (Dialect.OPENAI, "computer"),
                          (Dialect.GEMINI, "browser_use")):
        with pytest.raises(FieldError) as exc:
            translate(dialect, name, {})
        assert exc.value.field == "name" and f"the {dialect} dialect" in exc.value.reason
    err = refused(Dialect.ANTHROPIC, "computer", ["screenshot"])
    assert (err.field, err.reason) == ("arguments", "must be an object")


# --- tool definitions ------------------------------------------------------------------------


def test_openai_definitions_are_rigds_own() -> None:
    assert definitions(Dialect.OPENAI, list(openai_definitions()), SAME) == list(openai_definitions())


def test_anthropic_definitions_hold_the_computer_tool_sized_to_the_screenshot() -> None:
    tools = definitions(Dialect.ANTHROPIC, list(openai_definitions()), BIG)
    assert [t["name"] for t in tools] == ["rig_list", "rig_close", "terminal_use", "computer", "browser_use"]
    assert tools[3] == {"type": "computer_20250124", "name": "computer", "display_width_px": 1280,
                        "display_height_px": 800}
    assert tools[2]["input_schema"]["properties"]["rigId"]["type"] == "string"
    zoom = definitions(Dialect.ANTHROPIC, list(openai_definitions()), Frame.of(Display(1920, 1080)),
                       "computer_20251124")[3]
    assert zoom == {"type": "computer_20251124", "name": "computer", "display_width_px": 1280,
                    "display_height_px": 720, "enable_zoom": True}


def test_openai_computer_definitions_are_responses_tools() -> None:
    tools = definitions(Dialect.OPENAI_COMPUTER, list(openai_definitions()), BIG)
    assert tools[3] == {"type": "computer_use_preview", "display_width": 1280, "display_height": 800,
                        "environment": "linux"}
    fn = tools[0]
    assert fn["type"] == "function" and fn["name"] == "rig_list" and fn["strict"] is False
    assert "parameters" in fn and "function" not in fn


def test_gemini_definitions_are_function_declarations_in_geminis_schema_subset() -> None:
    own, actions = definitions(Dialect.GEMINI, list(openai_definitions()), SAME)
    decls = {d["name"]: d for d in own["functionDeclarations"]}
    assert list(decls) == ["rig_list", "rig_close", "terminal_use", "computer_use"]
    assert "parameters" not in decls["rig_list"]  # Gemini refuses an object without properties
    terminal = decls["terminal_use"]["parameters"]
    assert "additionalProperties" not in str(terminal) and "env" not in terminal["properties"]
    assert [d["name"] for d in actions["functionDeclarations"]] == list(GEMINI_ACTIONS)


# --- results ---------------------------------------------------------------------------------


def _png(w: int, h: int, box: tuple[int, int, int, int] | None = None) -> str:
    image = Image.new("RGB", (w, h), (255, 255, 255))
    if box is not None:
        image.paste((255, 0, 0), box)
    buf = io.BytesIO()
    image.save(buf, "PNG")
    return base64.b64encode(buf.getvalue()).decode()


def shot(data: str = "AAAA", *, display: tuple[int, int] = (2560, 1600), size: tuple[int, int] = (1280, 800),
         scale: object = 2.0, **extra: Any) -> dict[str, Any]:
    return {"image": {"mediaType": "image/png", "data": data},
            "display": {"width": display[0], "height": display[1]},
            "imageSize": {"width": size[0], "height": size[1]}, "scale": scale, **extra}


def _call(dialect: Dialect, name: str, args: dict[str, Any]) -> Call:
    call = translate(dialect, name, args)
    assert call is not None
    return call


def test_a_screenshot_states_its_scale_and_the_pointer_in_image_pixels() -> None:
    call = _call(Dialect.ANTHROPIC, "computer", {"action": "left_click", "coordinate": [640, 400]})
    out = render(call, BIG, shot(cursor=[1280, 800]))
    image, text = out["content"]
    assert image == {"type": "image", "data": "AAAA", "mimeType": "image/png"}
    assert "1280x800 image of the 2560x1600 display, scale 2.0" in text["text"]
    assert "Pointer at 640,400." in text["text"] and text["text"].startswith("left_click: done.")
    gemini = render(_call(Dialect.GEMINI, "click_at", {"x": 1, "y": 1}), SAME,
                    shot(display=(1280, 800), scale=1.0))["content"][1]["text"]
    assert "0-999 of this image" in gemini and "1280x800 viewport" in gemini


def test_the_cursor_position_is_given_in_image_pixels() -> None:
    out = render(_call(Dialect.ANTHROPIC, "computer", {"action": "cursor_position"}), BIG,
                 {"coordinate": [1280, 800], "display": {"width": 2560, "height": 1600}})
    assert out["content"][0]["text"].startswith("X=640,Y=400")


def test_zoom_asks_the_rig_for_the_region_at_display_resolution_and_shows_its_answer() -> None:
    call = _call(Dialect.ANTHROPIC, "computer", {"action": "zoom", "region": [100, 100, 200, 150]})
    # On a 2560x1600 display shown 1280x800, image region -> display region (scale 2).
    assert [p.action for p in call.plan(BIG)] == [{"action": "zoom", "region": [200, 200, 400, 300]}]
    data = _png(200, 100, (0, 0, 200, 100))
    image, text = render(call, BIG, shot(data, display=(2560, 1600), size=(200, 100), scale=1.0))["content"]
    assert image == {"type": "image", "data": data, "mimeType": "image/png"}
    assert "Zoom of [100, 100, 200, 150]" in text["text"] and "display's own resolution" in text["text"]
    assert "1280x800 screenshot" in text["text"]


@pytest.mark.parametrize("result", [shot(scale=True), {"image": "AAAA"}, shot(size=(0, 8))])
def test_a_malformed_zoom_answer_is_a_backend_error(result: dict[str, Any]) -> None:
    call = _call(Dialect.ANTHROPIC, "computer", {"action": "zoom", "region": [0, 0, 10, 10]})
    with pytest.raises(BackendError):
        render(call, SAME, result)


@pytest.mark.parametrize("result", [
    shot(scale=True), shot(scale=0), shot(size=(0, 800)), {"image": "AAAA"},
    shot() | {"image": {"mediaType": "text/html", "data": "x"}},
])
def test_a_malformed_screenshot_result_is_a_backend_error(result: dict[str, Any]) -> None:
    with pytest.raises(BackendError):
        render(_call(Dialect.OPENAI_COMPUTER, "computer", {"action": {"type": "screenshot"}}), BIG, result)


@pytest.mark.parametrize("coordinate", [[-1, 2], [1], "1,2", [True, 2], None])
def test_a_malformed_cursor_position_is_a_backend_error(coordinate: object) -> None:
    with pytest.raises(BackendError):
        render(_call(Dialect.ANTHROPIC, "computer", {"action": "cursor_position"}), BIG, {"coordinate": coordinate})
