"""Rules every tool shares: the tool name, the payload shape, the verb name,
unknown fields, nulls, the surface check, and the observation flags."""

from __future__ import annotations

import pytest

from rigd.errors import FieldError
from rigd.model import Display, Surface, Tool
from rigd.verbs import (
    OBSERVATION_VERBS,
    TOOL_VERBS,
    Action,
    ComputerLeftClick,
    ComputerScreenshot,
    ParseContext,
    is_observation,
    parse_action,
    verbs_of,
)

CTX = ParseContext(display=Display(1280, 800))


def err(tool: object, payload: object, ctx: ParseContext = CTX) -> FieldError:
    result = parse_action(tool, payload, ctx)  # type: ignore[arg-type]
    assert isinstance(result, FieldError), result
    return result


# RIGS.md §4, verbatim (plus computer_use's zoom, issue 13, and browser_use's login, issue 30 and
# API.md "Screens, marks, logins"): every verb of every tool, ○ marking observations.
SPEC_VERBS = {
    Tool.TERMINAL_USE: "exec",
    Tool.COMPUTER_USE: (
        "screenshot○ cursor_position○ zoom○ mouse_move left_click right_click middle_click "
        "double_click triple_click left_mouse_down left_mouse_up left_click_drag scroll key "
        "hold_key type wait○ set_display clipboard_read○ clipboard_write"
    ),
    Tool.BROWSER_USE: (
        "navigate reload stop_loading click fill type key scroll mouse_move drag "
        "left_mouse_down left_mouse_up extract○ screenshot○ set_viewport history wait_for○ "
        "clipboard_read○ clipboard_write login"
    ),
    Tool.MOBILE_USE: (
        "tap swipe type key screenshot○ ui_dump○ install_apk start_app stop_app "
        "clear_app_data uninstall_app open_url shell"
    ),
    Tool.IOS_USE: (
        "tap swipe type key home lock unlock screenshot○ ui_dump○ install_app start_app "
        "stop_app uninstall_app open_url spawn"
    ),
}


@pytest.mark.parametrize("tool", list(Tool))
def test_every_verb_of_the_spec_and_no_other(tool: Tool) -> None:
    words = SPEC_VERBS[tool].split()
    assert verbs_of(tool) == tuple(w.rstrip("○") for w in words)
    assert OBSERVATION_VERBS[tool] == {w.rstrip("○") for w in words if w.endswith("○")}


@pytest.mark.parametrize("tool", list(Tool))
def test_each_action_class_knows_its_tool_verb_and_observation(tool: Tool) -> None:
    for verb, spec in TOOL_VERBS[tool].items():
        cls = spec.action_type
        assert cls.tool is tool
        assert cls.verb == verb
        assert cls.__dataclass_params__.frozen  # type: ignore[attr-defined]
        assert "__slots__" in cls.__dict__
        assert cls.observation == (verb in OBSERVATION_VERBS[tool])


def test_is_observation() -> None:
    assert is_observation(ComputerScreenshot())
    assert not is_observation(ComputerLeftClick())


def test_actions_are_frozen_and_slotted() -> None:
    action = ComputerLeftClick(coordinate=(1, 2))
    with pytest.raises(AttributeError):
        action.coordinate = (3, 4)  # type: ignore[misc]
    assert not hasattr(action, "__dict__")
    assert action == ComputerLeftClick(coordinate=(1, 2))
    assert hash(action) == hash(ComputerLeftClick(coordinate=(1, 2)))


@pytest.mark.parametrize("tool", ["clik_use", "", "COMPUTER_USE", "rig_list", None, 3, ["x"]])
def test_tool_name_is_validated(tool: object) -> None:
    e = err(tool, {"action": "screenshot"})
    assert e.field == "tool"
    assert "must be one of terminal_use, computer_use, browser_use, mobile_use, ios_use" in e.reason


@pytest.mark.parametrize("payload", [None, "screenshot", 3, 1.5, True, ["screenshot"]])
def test_payload_must_be_an_object(payload: object) -> None:
    e = err("computer_use", payload)
    assert e.field == "action"
    assert "must be an object" in e.reason


def test_missing_verb() -> None:
    e = err("computer_use", {"coordinate": [1, 2]})
    assert e.field == "action.action"
    assert e.reason.startswith("is required: the computer_use verb, one of: screenshot,")


@pytest.mark.parametrize("verb", [3, True, ["left_click"], {"a": 1}])
def test_verb_must_be_a_string(verb: object) -> None:
    e = err("computer_use", {"action": verb})
    assert e.field == "action.action"
    assert "must be a string naming a computer_use verb" in e.reason


def test_unknown_verb_lists_the_verbs_and_suggests() -> None:
    e = err("computer_use", {"action": "clik"})
    assert e.field == "action.action"
    assert e.reason.startswith("unknown computer_use verb 'clik' (did you mean 'left_click'?)")
    assert "; one of: screenshot, cursor_position, zoom, mouse_move," in e.reason


def test_a_verb_of_another_tool_is_named_as_such() -> None:
    e = err("mobile_use", {"action": "left_click_drag"})
    assert "(that is a computer_use verb)" in e.reason
    assert "one of: tap, swipe," in e.reason


def test_unknown_verb_quote_is_bounded() -> None:
    e = err("computer_use", {"action": "x" * 100_000})
    assert len(e.reason) < 1000


def test_unknown_field_is_refused_by_name_with_a_suggestion() -> None:
    e = err("computer_use", {"action": "mouse_move", "coordinates": [1, 2]})
    assert e.field == "action.coordinates"
    assert "unknown field for computer_use mouse_move (did you mean 'coordinate'?)" in e.reason
    assert "it takes coordinate" in e.reason


def test_unknown_fields_are_all_named() -> None:
    e = err("computer_use", {"action": "cursor_position", "foo": 1, "bar": 2})
    assert e.field == "action.foo"
    assert "unknown fields 'foo', 'bar' for computer_use cursor_position; it takes no fields" in e.reason
    e = err("computer_use", {"action": "screenshot", "foo": 1})
    assert e.field == "action.foo" and "for computer_use screenshot; it takes marks" in e.reason


def test_odd_field_names_get_a_bracketed_path() -> None:
    e = err("computer_use", {"action": "screenshot", "a.b c": 1})
    assert e.field == 'action["a.b c"]'


def test_a_refused_field_says_why() -> None:
    e = err("browser_use", {"action": "clipboard_read", "selection": "primary"})
    assert e.field == "action.selection"
    assert "a browser has a single clipboard" in e.reason


def test_null_counts_as_absent() -> None:
    # OpenAI strict mode sends null for every unused optional parameter.
    result = parse_action(
        "computer_use",
        {"action": "left_click", "coordinate": None, "text": None, "scroll_amount": None},
        CTX,
    )
    assert result == ComputerLeftClick()


def test_a_misspelt_field_is_refused_even_when_null() -> None:
    e = err("computer_use", {"action": "left_click", "coordinates": None})
    assert e.field == "action.coordinates"


def test_a_null_required_field_is_missing() -> None:
    e = err("computer_use", {"action": "mouse_move", "coordinate": None})
    assert e.field == "action.coordinate"
    assert e.reason.startswith("is required")


@pytest.mark.parametrize(
    ("tool", "surface", "ok"),
    [
        ("terminal_use", Surface.TERMINAL, True),
        ("terminal_use", Surface.COMPUTER, True),
        ("computer_use", Surface.COMPUTER, True),
        ("computer_use", Surface.TERMINAL, False),
        ("browser_use", Surface.COMPUTER, False),
        ("mobile_use", Surface.IOS, False),
        ("ios_use", Surface.IOS, True),
    ],
)
def test_the_tool_must_fit_the_surface(tool: str, surface: Surface, ok: bool) -> None:
    payload = {"action": "exec", "command": "true"} if tool == "terminal_use" else {
        "action": "screenshot"
    }
    result = parse_action(tool, payload, ParseContext(surface=surface))
    if ok:
        assert isinstance(result, Action)
    else:
        assert isinstance(result, FieldError)
        assert result.field == "tool"
        assert f"{tool} cannot drive a {surface} rig" in result.reason


def test_context_defaults_to_unknown_display() -> None:
    result = parse_action("computer_use", {"action": "mouse_move", "coordinate": [5000, 5000]})
    assert result == parse_action(
        "computer_use", {"action": "mouse_move", "coordinate": [5000, 5000]}, ParseContext()
    )
    assert isinstance(result, Action)


def test_field_error_to_json_matches_the_api_shape() -> None:
    e = err("computer_use", {"action": "mouse_move", "coordinate": [1280, 0]})
    assert e.to_json()["data"] == {
        "field": "action.coordinate",
        "reason": "must be two integers inside the 1280x800 display (got [1280, 0])",
    }
