"""Property tests: parse_action and audit_args are total, and the audit
record never holds typed text, whatever the payload."""

from __future__ import annotations

import json
import os

from hypothesis import given, settings
from hypothesis import strategies as st

from rigd.errors import FieldError
from rigd.model import Display, Surface, Tool
from rigd.verbs import TOOL_VERBS, Action, ParseContext, audit_args, parse_action
from rigd.verbs._args import field_path

# RIGD_VERBS_EXAMPLES=20000 for a long soak; the default keeps the suite fast.
SETTINGS = settings(
    max_examples=int(os.environ.get("RIGD_VERBS_EXAMPLES", "300")), deadline=None
)

# Text includes unpaired surrogates, control characters and NUL.
TEXT = st.text(st.characters(exclude_categories=()), max_size=24)
# Built by map: an int over 4300 digits cannot even be repr()'d, by Hypothesis or pytest.
HUGE = st.sampled_from([2**63, -(2**63) - 1, 2**64]) | st.tuples(
    st.sampled_from([1, -1]), st.sampled_from([100, 5000])
).map(lambda sign_exp: sign_exp[0] * 10 ** sign_exp[1])
FLOATS = st.floats(allow_nan=True, allow_infinity=True)
SCALARS = st.none() | st.booleans() | st.integers() | HUGE | FLOATS | TEXT
JSON = st.recursive(
    SCALARS,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(TEXT, children, max_size=4),
    max_leaves=16,
)
TOOL_NAMES = st.sampled_from([tool.value for tool in Tool]) | TEXT | JSON
CONTEXTS = st.builds(
    ParseContext,
    display=st.none() | st.builds(Display, st.integers(1, 4000), st.integers(1, 4000)),
    surface=st.none() | st.sampled_from(list(Surface)),
)
# Values close to valid ones, so the success paths are exercised too.
PLAUSIBLE = st.one_of(
    st.lists(st.integers(-5, 3000), min_size=2, max_size=2),
    st.sampled_from([
        "ctrl+s", "Return", "shift", "alt+Tab F5", "Enter", "Control+a", "back", "KEYCODE_HOME",
        "enter", "up", "a", "https://example.com/", "http://u:p@x.com/", "myapp://x",
        "file:///x", "/work/app.apk", "/w/Foo.app", "/w/../x.apk", "com.example.app",
        "a11y", "dom", "console", "forward", "down", "clipboard", "primary", "xdnd",
        "#q", "hello", "", "ls -l", "/tmp", "command", "1bad",
    ]),
    st.integers(-10, 6000),
    st.floats(-1, 4000),
    st.booleans(),
    st.none(),
    st.lists(TEXT, max_size=3),
    st.lists(st.sampled_from(["command", "shift", "cmd", "option"]), max_size=3),
    st.dictionaries(st.sampled_from(["FOO", "_X", "1bad", ""]), TEXT, max_size=3),
    JSON,
)
EXTRA_FIELDS = ["text", "coordinate", "selector", "argv", "bogus", "Text", "action2"]
POINT = st.lists(st.integers(0, 40), min_size=2, max_size=2)
# Values valid for a field name (for at least one verb that takes it).
GOOD: dict[str, st.SearchStrategy[object]] = {
    "coordinate": POINT,
    "start_coordinate": POINT,
    "text": st.sampled_from(["a", "shift", "ctrl+s Return", "back", "Enter", "enter", "hi ✓"]),
    "scroll_direction": st.sampled_from(["up", "down", "left", "right"]),
    "scroll_amount": st.integers(1, 100),
    "duration": st.floats(0, 60),
    "width": st.sampled_from([320, 640, 1280, 2560]),
    "height": st.sampled_from([240, 480, 800, 1600]),
    "selection": st.sampled_from(["clipboard", "primary", "xdnd"]),
    "url": st.sampled_from(["https://example.com/", "http://app.test:3000/x", "myapp://a"]),
    "hard": st.booleans(),
    "full_page": st.booleans(),
    "marks": st.booleans(),
    "site": st.sampled_from(["https://accounts.example.com", "https://a.test:8443"]),
    "account": st.sampled_from(["ada@example.com", "ada"]),
    "mark": st.integers(1, 50),
    "selector": st.sampled_from(["#q", "text=Sign in"]),
    "kind": st.sampled_from(["a11y", "dom", "console"]),
    "direction": st.sampled_from(["back", "forward"]),
    "timeoutS": st.floats(0.1, 30),
    "durationMs": st.integers(50, 5000),
    "path": st.sampled_from(["/w/app.apk", "/w/Foo.app"]),
    "package": st.just("com.example.app"),
    "bundleId": st.just("com.apple.mobilesafari"),
    "argv": st.lists(st.sampled_from(["ls", "-l", ""]), min_size=1, max_size=3).map(
        lambda argv: ["ls", *argv]
    ),
    "command": st.just("ls -l"),
    "cwd": st.just("/tmp"),
    "env": st.dictionaries(st.sampled_from(["A", "_B"]), TEXT.filter(lambda t: "\x00" not in t)),
    "stdin": TEXT,
    "user": st.sampled_from(["root", "rig"]),
    "region": st.just([0, 0, 10, 10]),
    "modifiers": st.lists(st.sampled_from(["command", "shift"]), max_size=2, unique=True),
}


@st.composite
def verb_calls(draw: st.DrawFn) -> tuple[Tool, dict[str, object]]:
    """A real verb of a real tool with its own fields, mostly well-formed."""
    tool = draw(st.sampled_from(list(Tool)))
    verb = draw(st.sampled_from([*TOOL_VERBS[tool], "clipboard_read", "clipboard_write"]))
    spec = TOOL_VERBS[tool].get(verb)
    payload: dict[str, object] = {"action": verb}
    for name in spec.fields if spec else ():
        how = draw(st.sampled_from(["good", "good", "good", "absent", "odd"]))
        if how == "good":
            payload[name] = draw(GOOD[name])
        elif how == "odd":
            payload[name] = draw(PLAUSIBLE)
    if draw(st.integers(0, 9)) == 0:
        payload.update(draw(st.dictionaries(st.sampled_from(EXTRA_FIELDS), PLAUSIBLE)))
    return tool, payload


CALL_CONTEXTS = st.builds(
    ParseContext,
    display=st.none() | st.builds(Display, st.integers(1, 4000), st.integers(1, 4000)),
    surface=st.one_of(st.none(), st.none(), st.none(), st.sampled_from(list(Surface))),
)


def check_answer(tool: object, payload: object, result: Action | FieldError) -> None:
    if isinstance(result, FieldError):
        assert result.field == "tool" or result.field.startswith("action")
        assert len(result.reason) < 2000
        # Serialisable as a JSON-RPC error, also as UTF-8 text.
        json.dumps(result.to_json(), allow_nan=False, ensure_ascii=False).encode("utf-8")
        return
    assert isinstance(result, Action)
    assert isinstance(payload, dict)
    assert result.tool == tool
    assert result.verb == payload["action"]
    assert isinstance(result, TOOL_VERBS[result.tool][result.verb].action_type)


def check_record(record: dict[str, object]) -> str:
    assert isinstance(record, dict)
    text = json.dumps(record, allow_nan=False, ensure_ascii=False)
    text.encode("utf-8")
    return text


@SETTINGS
@given(tool=TOOL_NAMES, payload=JSON, ctx=CONTEXTS)
def test_parse_action_is_total(tool: object, payload: object, ctx: ParseContext) -> None:
    check_answer(tool, payload, parse_action(tool, payload, ctx))  # type: ignore[arg-type]


@SETTINGS
@given(tool=st.sampled_from(list(Tool)), payload=st.dictionaries(TEXT, JSON, max_size=5))
def test_parse_action_is_total_for_any_object(tool: Tool, payload: dict[str, object]) -> None:
    check_answer(tool, payload, parse_action(tool, payload))


@SETTINGS
@given(call=verb_calls(), ctx=CALL_CONTEXTS)
def test_parse_action_is_total_for_real_verbs(
    call: tuple[Tool, dict[str, object]], ctx: ParseContext
) -> None:
    tool, payload = call
    check_answer(tool, payload, parse_action(tool, payload, ctx))


@SETTINGS
@given(call=verb_calls(), name=TEXT, value=JSON.filter(lambda v: v is not None))
def test_an_unknown_field_is_refused_by_name(
    call: tuple[Tool, dict[str, object]], name: str, value: object
) -> None:
    tool, payload = call
    spec = TOOL_VERBS[tool].get(str(payload["action"]))
    if spec is None or name == "action" or name in spec.fields:
        return
    payload = {"action": payload["action"], name: value}
    result = parse_action(tool, payload)
    assert isinstance(result, FieldError)
    assert result.field == field_path("action", name)


@SETTINGS
@given(tool=TOOL_NAMES, payload=JSON)
def test_audit_args_is_total(tool: object, payload: object) -> None:
    check_record(audit_args(tool, payload))


@SETTINGS
@given(call=verb_calls())
def test_audit_args_is_total_for_real_verbs(call: tuple[Tool, dict[str, object]]) -> None:
    check_record(audit_args(*call))


# Where secrets go: typed text and key text of every tool, exec stdin and env.
SECRET_SLOTS = [
    (tool, verb, "text")
    for tool, verbs in TOOL_VERBS.items()
    for verb, spec in verbs.items()
    if "text" in spec.fields
] + [
    (Tool.TERMINAL_USE, "exec", "stdin"),
    (Tool.MOBILE_USE, "clipboard_write", "text"),
    (Tool.COMPUTER_USE, "type", "txt"),
]


def shaped(secret: str) -> st.SearchStrategy[object]:
    """The secret as a string, or buried in the wrong shape."""
    return st.sampled_from([
        secret, [secret], [["x", secret]], {"value": secret}, {secret: 1}, [{"a": [secret]}],
    ])


@SETTINGS
@given(
    slot=st.sampled_from(SECRET_SLOTS),
    # No whitespace: "⟦ ⟧" is two one-character keys, valid key syntax, and
    # key text that parses as keys is kept on purpose.
    core=TEXT.map(lambda text: "".join(c for c in text if not c.isspace())),
    data=st.data(),
    others=st.dictionaries(st.sampled_from(["coordinate", "selector", "bogus"]), PLAUSIBLE),
)
def test_audit_never_holds_typed_text(
    slot: tuple[Tool, str, str], core: str, data: st.DataObject, others: dict[str, object]
) -> None:
    tool, verb, field = slot
    # Brackets no kept argument here contains, so any match is a leak; never
    # valid key syntax either, so key verbs must mask it as well.
    secret = "⟦" + core + "⟧"
    value = data.draw(shaped(secret))
    payload = {**others, "action": verb, field: value}
    text = check_record(audit_args(tool, payload))
    assert secret not in text
    assert "⟦" not in text


@SETTINGS
@given(core=TEXT, data=st.data())
def test_audit_never_holds_env_values(core: str, data: st.DataObject) -> None:
    secret = "⟦" + core + "⟧"
    env = data.draw(st.sampled_from([{"TOKEN": secret}, {"A": [secret]}, [secret], secret]))
    record = audit_args("terminal_use", {"action": "exec", "command": "true", "env": env})
    assert "⟦" not in check_record(record)
