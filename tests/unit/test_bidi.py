"""The WebDriver BiDi core and the Firefox driver's pure parts: envelopes, script answers,
console lines, cookies, screenshots and the profile's user.js."""

from __future__ import annotations

import io
import json
import struct
import zlib
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from PIL import Image

from rigd.browser.firefox import (
    FIREFOX_PREFS,
    console_entry,
    cookie_to_bidi,
    cookie_to_saved,
    fit_jpeg,
    parse_script_result,
    user_js,
)
from rigd.browser.page import CONSOLE_ENTRY_MAX_CHARS
from rigd.browser.profiles import parse_state
from rigd.protocols.bidi import BiDiProtocol, error_code
from rigd.protocols.cdp import (
    MAX_ERROR_CHARS,
    MAX_ID,
    CDPError,
    CDPProtocolError,
    ErrorReply,
    Event,
    ProtocolViolation,
    Reply,
    read,
)

# -- BiDiProtocol.command ------------------------------------------------------------------------

def test_command_shape() -> None:
    p = BiDiProtocol()
    cid, text = p.command("browsingContext.navigate", {"context": "C1", "url": "https://example.test/",
                                                       "wait": "complete"})
    assert json.loads(text) == {"id": cid, "method": "browsingContext.navigate",
                                "params": {"context": "C1", "url": "https://example.test/",
                                           "wait": "complete"}}
    cid2, text2 = p.command("session.status")
    assert json.loads(text2) == {"id": cid2, "method": "session.status", "params": {}}
    # Non-ASCII is sent as is, not escaped.
    _, text3 = p.command("input.performActions", {"text": "é✓"})
    assert "é✓" in text3


def test_ids_increase_and_wrap_at_max_id() -> None:
    p = BiDiProtocol()
    first, _ = p.command("session.status")
    second, _ = p.command("session.status")
    assert first == 1 and second == 2
    p._next_id = MAX_ID - 1
    assert p.command("session.status")[0] == MAX_ID - 1
    assert p.command("session.status")[0] == MAX_ID
    assert p.command("session.status")[0] == 1
    assert p.command("session.status")[0] == 2


def test_a_session_id_is_refused() -> None:
    p = BiDiProtocol()
    with pytest.raises(ValueError, match="no sessionId"):
        p.command("session.status", {}, "A1B2")
    # The refused command took no id.
    assert p.command("session.status")[0] == 1


@pytest.mark.parametrize("method", ["session", "session.", ".status", "session.status; drop",
                                    "session.sta tus", "a.b.c", "", "x" * 41 + ".y", "x." + "y" * 81,
                                    "sëssion.status"])
def test_a_bad_method_name_is_refused(method: str) -> None:
    p = BiDiProtocol()
    with pytest.raises(ValueError, match="not a BiDi method name"):
        p.command(method)
    assert p.command("session.status")[0] == 1


# -- BiDiProtocol.parse: the good shapes ---------------------------------------------------------

def test_success_is_a_reply_without_session() -> None:
    p = BiDiProtocol()
    msg = p.parse('{"type": "success", "id": 5, "result": {"navigation": "N", "url": "https://a.test/"}}')
    assert msg == Reply(5, None, {"navigation": "N", "url": "https://a.test/"})
    assert p.parse(b'{"type": "success", "id": 2147483647, "result": {}}') == Reply(MAX_ID, None, {})


def test_error_is_an_error_reply_with_the_word_first() -> None:
    p = BiDiProtocol()
    msg = p.parse(json.dumps({"type": "error", "id": 9, "error": "no such history entry",
                              "message": "Cannot traverse: at the start", "stacktrace": "..."}))
    assert msg == ErrorReply(9, None, 0, "no such history entry: Cannot traverse: at the start")
    assert isinstance(msg, ErrorReply)
    assert error_code(msg.message) == "no such history entry"
    other = p.parse('{"type": "error", "id": 10, "error": "invalid argument", "message": "a: b: c"}')
    assert isinstance(other, ErrorReply)
    assert error_code(other.message) == "invalid argument"


def test_error_without_a_message_and_long_messages_are_bounded() -> None:
    p = BiDiProtocol()
    msg = p.parse('{"type": "error", "id": 3, "error": "unknown command"}')
    assert msg == ErrorReply(3, None, 0, "unknown command: (no message)")
    msg = p.parse(json.dumps({"type": "error", "id": 3, "error": "unknown error", "message": 42}))
    assert msg == ErrorReply(3, None, 0, "unknown error: (no message)")
    long = p.parse(json.dumps({"type": "error", "id": 4, "error": "invalid argument", "message": "m" * 5000}))
    assert isinstance(long, ErrorReply)
    assert len(long.message) == MAX_ERROR_CHARS
    assert long.message.startswith("invalid argument: mmm")
    assert error_code(long.message) == "invalid argument"


@pytest.mark.parametrize("word", ["No Such Frame", "no_such_frame", "no-such-frame", "x" * 61, "",
                                  "évidemment", "no such frame\n", 7, None, ["no such frame"],
                                  "invalid argument: injected"])
def test_an_error_word_that_is_not_lowercase_words_is_unknown_error(word: object) -> None:
    msg = BiDiProtocol().parse(json.dumps({"type": "error", "id": 6, "error": word, "message": "said"}))
    assert msg == ErrorReply(6, None, 0, "unknown error: said")
    assert isinstance(msg, ErrorReply)
    assert error_code(msg.message) == "unknown error"


def test_error_code_of_text_without_a_word() -> None:
    assert error_code("no colon here") == ""
    assert error_code("no such frame: x") == "no such frame"


def test_an_error_with_a_null_id_is_a_violation() -> None:
    msg = BiDiProtocol().parse('{"type": "error", "id": null, "error": "invalid argument", '
                               '"message": "Expected \\"id\\" to be a number"}')
    assert isinstance(msg, ProtocolViolation)
    assert "could not read a command" in msg.reason
    assert 'Expected "id" to be a number' in msg.reason
    # No id at all, and a hostile message: bounded and typed.
    msg = BiDiProtocol().parse(json.dumps({"type": "error", "error": "x", "message": "m" * 5000}))
    assert isinstance(msg, ProtocolViolation)
    assert len(msg.reason) < 300
    msg = BiDiProtocol().parse('{"type": "error", "id": null, "message": [1]}')
    assert isinstance(msg, ProtocolViolation)
    assert "(no message)" in msg.reason


def test_event_is_an_event_without_session() -> None:
    p = BiDiProtocol()
    params = {"context": "C1", "navigation": "N", "timestamp": 17, "url": "https://a.test/"}
    assert p.parse(json.dumps({"type": "event", "method": "browsingContext.load", "params": params})) == \
        Event("browsingContext.load", None, params)
    # params may be left out; an id on an event is ignored.
    assert p.parse('{"type": "event", "method": "log.entryAdded", "id": 0}') == \
        Event("log.entryAdded", None, {})


# -- BiDiProtocol.parse: hostile shapes ----------------------------------------------------------

@pytest.mark.parametrize(("text", "reason"), [
    ("{nope", "not JSON"),
    ("", "not JSON"),
    ("[" * 100_000, "not JSON"),
    ("[1, 2]", "not a JSON object"),
    ('"success"', "not a JSON object"),
    ("null", "not a JSON object"),
    ("7", "not a JSON object"),
    ('{"type": "success", "id": true, "result": {}}', "id is not"),
    ('{"type": "success", "id": false, "result": {}}', "id is not"),
    ('{"type": "success", "id": 0, "result": {}}', "id is not"),
    ('{"type": "success", "id": -1, "result": {}}', "id is not"),
    ('{"type": "success", "id": 2147483648, "result": {}}', "id is not"),
    ('{"type": "success", "id": 99999999999999999999999, "result": {}}', "id is not"),
    ('{"type": "success", "id": "1", "result": {}}', "id is not"),
    ('{"type": "success", "id": 1.0, "result": {}}', "id is not"),
    ('{"type": "success", "id": null, "result": {}}', "id is not"),
    ('{"type": "success", "result": {}}', "id is not"),
    ('{"type": "error", "id": true, "error": "invalid argument", "message": "x"}', "id is not"),
    ('{"type": "error", "id": 0, "error": "invalid argument", "message": "x"}', "id is not"),
    ('{"type": "error", "id": "3", "error": "invalid argument", "message": "x"}', "id is not"),
    ('{"type": "success", "id": 3, "result": []}', "result of id=3"),
    ('{"type": "success", "id": 3, "result": "ok"}', "result of id=3"),
    ('{"type": "success", "id": 3, "result": null}', "result of id=3"),
    ('{"type": "success", "id": 3}', "result of id=3"),
    ('{"type": "event", "method": "log.entryAdded", "params": [1]}', "params of log.entryAdded"),
    ('{"type": "event", "method": "log.entryAdded", "params": null}', "params of log.entryAdded"),
    ('{"type": "event", "method": "log.entryAdded", "params": "x"}', "params of log.entryAdded"),
    ('{"type": "event", "method": "not a method", "params": {}}', "without a method name"),
    ('{"type": "event", "method": 5, "params": {}}', "without a method name"),
    ('{"type": "event", "params": {}}', "without a method name"),
    ('{"type": "reply", "id": 3, "result": {}}', "neither success, error nor event"),
    ('{"type": null, "id": 3, "result": {}}', "neither success, error nor event"),
    ('{"type": ["success"], "id": 3, "result": {}}', "neither success, error nor event"),
    ('{"id": 3, "result": {}}', "neither success, error nor event"),
    # A CDP-shaped reply or event is not BiDi.
    ('{"method": "log.entryAdded", "params": {}}', "id is not"),
    ('{"id": 3, "error": {"code": -32000, "message": "x"}}', "neither success, error nor event"),
])
def test_hostile_shapes_are_violations(text: str, reason: str) -> None:
    msg = BiDiProtocol().parse(text)
    assert isinstance(msg, ProtocolViolation)
    assert reason in msg.reason


def test_bytes_that_are_not_utf8_are_a_violation() -> None:
    msg = BiDiProtocol().parse(b'{"type": "success", "id": 1, "result": {"x": "\xff\xfe"}}')
    assert msg == ProtocolViolation("not JSON")


def test_message_size_is_capped_before_parsing() -> None:
    p = BiDiProtocol(max_message_chars=100)
    big = '{"type": "success", "id": 1, "result": {"x": "' + "y" * 200 + '"}}'
    msg = p.parse(big)
    assert isinstance(msg, ProtocolViolation)
    assert f"a message of {len(big)} characters is over the 100 cap" == msg.reason
    assert isinstance(p.parse(big.encode()), ProtocolViolation)
    # Just under the cap still parses.
    small = '{"type": "success", "id": 1, "result": {"x": "' + "y" * 40 + '"}}'
    assert len(small) <= 100
    assert p.parse(small) == Reply(1, None, {"x": "y" * 40})


_JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
                     lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=8), kids,
                                                                                max_size=4),
                     max_leaves=20)


@given(st.one_of(st.text(max_size=300), st.binary(max_size=300)))
def test_parse_of_any_text_never_raises(data: str | bytes) -> None:
    msg = BiDiProtocol(max_message_chars=200).parse(data)
    assert isinstance(msg, Reply | ErrorReply | Event | ProtocolViolation)


@given(_JSON, st.sampled_from(["success", "error", "event", "other", None]))
def test_parse_of_any_json_never_raises(value: Any, kind: str | None) -> None:
    p = BiDiProtocol()
    for wrapped in (value, {"type": kind, "id": value, "result": {}},
                    {"type": kind, "id": 1, "result": value},
                    {"type": kind, "id": 1, "error": value, "message": value},
                    {"type": kind, "id": None, "error": "x", "message": value},
                    {"type": kind, "method": value, "params": {}},
                    {"type": kind, "method": "log.entryAdded", "params": value}):
        msg = p.parse(json.dumps(wrapped))
        assert isinstance(msg, Reply | ErrorReply | Event | ProtocolViolation)
        if isinstance(msg, Reply | ErrorReply):
            assert 0 < msg.id <= MAX_ID and msg.session_id is None
        if isinstance(msg, ErrorReply):
            assert msg.code == 0 and len(msg.message) <= MAX_ERROR_CHARS and error_code(msg.message)


# -- parse_script_result -------------------------------------------------------------------------

def _script(result: dict[str, Any]) -> Any:
    return read(result, "script.callFunction", parse_script_result)


def test_a_string_answer_is_parsed_as_json() -> None:
    assert _script({"type": "success", "realm": "R",
                    "result": {"type": "string", "value": '{"a": [1, 2], "b": "é"}'}}) == {"a": [1, 2], "b": "é"}
    assert _script({"type": "success", "result": {"type": "string", "value": "3"}}) == 3
    assert _script({"type": "success", "result": {"type": "string", "value": '"x"'}}) == "x"
    assert _script({"type": "success", "result": {"type": "string", "value": "null"}}) is None


@pytest.mark.parametrize("kind", ["undefined", "null"])
def test_undefined_and_null_are_none(kind: str) -> None:
    assert _script({"type": "success", "result": {"type": kind}}) is None


def test_an_exception_is_a_cdp_error_with_the_details_text() -> None:
    with pytest.raises(CDPError) as info:
        _script({"type": "exception", "exceptionDetails": {
            "text": "TypeError: document.body is null", "lineNumber": 1, "columnNumber": 2}})
    assert str(info.value) == "TypeError: document.body is null"
    assert not isinstance(info.value, CDPProtocolError)
    with pytest.raises(CDPError) as info:
        _script({"type": "exception", "exceptionDetails": {"lineNumber": 1}})
    assert str(info.value) == "the script threw"
    with pytest.raises(CDPError) as info:
        _script({"type": "exception", "exceptionDetails": {"text": "E" * 5000}})
    assert str(info.value) == "E" * 300


@pytest.mark.parametrize("result", [
    {"type": "success", "result": {"type": "number", "value": 3}},
    {"type": "success", "result": {"type": "object", "value": [["a", {"type": "number", "value": 1}]]}},
    {"type": "success", "result": {"type": "boolean", "value": True}},
    {"type": "success", "result": {"type": 5}},
    {"type": "success", "result": {}},
    {"type": "success", "result": "3"},
    {"type": "success"},
    {"result": {"type": "string", "value": "3"}},
    {"type": "success", "result": {"type": "string"}},
    {"type": "success", "result": {"type": "string", "value": 3}},
    {"type": "exception"},
    {"type": "exception", "exceptionDetails": "boom"},
    {"type": "exception", "exceptionDetails": {"text": 7}},
])
def test_a_non_string_answer_or_a_bad_shape_is_a_protocol_error(result: dict[str, Any]) -> None:
    with pytest.raises(CDPProtocolError):
        _script(result)


@pytest.mark.parametrize("value", ["{nope", "", "undefined", "[" * 100_000])
def test_text_that_is_not_json_is_a_protocol_error(value: str) -> None:
    with pytest.raises(CDPProtocolError, match="not JSON"):
        _script({"type": "success", "result": {"type": "string", "value": value}})


# -- console_entry -------------------------------------------------------------------------------

def test_console_lines() -> None:
    assert console_entry({"type": "console", "method": "log", "level": "info", "text": "hi 42"}) == "[log] hi 42"
    assert console_entry({"type": "console", "method": "warn", "level": "warn", "text": "careful"}) == \
        "[warn] careful"
    assert console_entry({"type": "console", "method": "error", "text": "bad"}) == "[error] bad"
    # No method (or not a string): a plain log.
    assert console_entry({"type": "console", "text": "x"}) == "[log] x"
    assert console_entry({"type": "console", "method": 3, "text": "x"}) == "[log] x"
    assert console_entry({"type": "console", "method": "m" * 50, "text": "x"}) == "[" + "m" * 20 + "] x"


def test_javascript_errors_are_exceptions() -> None:
    assert console_entry({"type": "javascript", "level": "error", "text": "ReferenceError: x is not defined"}) \
        == "[exception] ReferenceError: x is not defined"


def test_other_kinds_and_bad_text() -> None:
    assert console_entry({"type": "cdp", "text": "t"}) == "[cdp] t"
    assert console_entry({"type": "console", "method": "log", "text": None}) == "[log] "
    assert console_entry({}) == "[None] "


def test_a_long_entry_is_cut_with_a_note() -> None:
    line = console_entry({"type": "console", "method": "log", "text": "x" * 5000})
    full = len("[log] ") + 5000
    assert line == "[log] " + "x" * (CONSOLE_ENTRY_MAX_CHARS - 6) + \
        f" [... {full - CONSOLE_ENTRY_MAX_CHARS} characters cut]"
    assert line.startswith("[log] xxx")
    assert "characters cut" in line and len(line) < CONSOLE_ENTRY_MAX_CHARS + 40
    exact = console_entry({"type": "console", "method": "log", "text": "x" * (CONSOLE_ENTRY_MAX_CHARS - 6)})
    assert len(exact) == CONSOLE_ENTRY_MAX_CHARS and "cut" not in exact


@given(st.dictionaries(st.sampled_from(["type", "method", "text", "level", "args"]), _JSON))
def test_console_entry_never_raises(params: dict[str, Any]) -> None:
    line = console_entry(params)
    assert isinstance(line, str) and line.startswith("[")


# -- cookies -------------------------------------------------------------------------------------

def _bidi_cookie(**over: Any) -> dict[str, Any]:
    c: dict[str, Any] = {"name": "sid", "value": {"type": "string", "value": "abc=1; x"},
                         "domain": ".example.test", "path": "/app", "size": 11, "httpOnly": True,
                         "secure": True, "sameSite": "strict", "expiry": 1_900_000_000}
    c.update(over)
    return c


@pytest.mark.parametrize(("same", "saved_same"), [("strict", "Strict"), ("lax", "Lax")])
def test_a_normal_cookie_round_trips(same: str, saved_same: str) -> None:
    raw = _bidi_cookie(sameSite=same)
    saved = cookie_to_saved(raw)
    assert saved == {"name": "sid", "value": "abc=1; x", "domain": ".example.test", "path": "/app",
                     "httpOnly": True, "secure": True, "sameSite": saved_same, "expires": 1_900_000_000.0}
    back = cookie_to_bidi(saved)
    assert back == {"name": "sid", "value": {"type": "string", "value": "abc=1; x"},
                    "domain": ".example.test", "path": "/app", "httpOnly": True, "secure": True,
                    "sameSite": same, "expiry": 1_900_000_000}
    # Through JSON, as a saved profile is.
    assert cookie_to_bidi(json.loads(json.dumps(saved))) == back


def test_an_insecure_session_cookie_round_trips() -> None:
    raw = {"name": "n", "value": {"type": "string", "value": "v"}, "domain": "a.test",
           "httpOnly": False, "secure": False, "sameSite": "lax"}
    saved = cookie_to_saved(raw)
    assert saved == {"name": "n", "value": "v", "domain": "a.test", "path": "/", "httpOnly": False,
                     "secure": False, "sameSite": "Lax"}
    assert "expires" not in saved
    back = cookie_to_bidi(saved)
    assert back == {"name": "n", "value": {"type": "string", "value": "v"}, "domain": "a.test",
                    "path": "/", "httpOnly": False, "secure": False, "sameSite": "lax"}
    assert "expiry" not in back


@pytest.mark.parametrize("value", [{"type": "base64", "value": "AAEC"}, {"type": "string", "value": 5},
                                   {"type": "string"}, "plain", None])
def test_a_binary_or_bad_value_is_not_saved(value: object) -> None:
    assert cookie_to_saved(_bidi_cookie(value=value)) is None


@pytest.mark.parametrize("raw", [None, "cookie", 3, ["sid"]])
def test_a_cookie_that_is_not_an_object_is_not_saved(raw: object) -> None:
    assert cookie_to_saved(raw) is None


def test_same_site_none_on_an_insecure_cookie_is_saved_without_it_and_put_back_lax() -> None:
    saved = cookie_to_saved(_bidi_cookie(secure=False, sameSite="none"))
    assert saved is not None
    assert "sameSite" not in saved
    assert saved["secure"] is False
    assert cookie_to_bidi(saved)["sameSite"] == "lax"


def test_same_site_none_on_a_secure_cookie_stays_none() -> None:
    saved = cookie_to_saved(_bidi_cookie(secure=True, sameSite="none"))
    assert saved is not None
    assert saved["sameSite"] == "None"
    assert cookie_to_bidi(saved)["sameSite"] == "none"
    # A secure saved cookie without sameSite goes back as none.
    del saved["sameSite"]
    assert cookie_to_bidi(saved)["sameSite"] == "none"


@pytest.mark.parametrize("expiry", [0, -5, 2**40, True, 1.5e9, "1900000000", None])
def test_an_unusable_expiry_is_a_session_cookie(expiry: object) -> None:
    saved = cookie_to_saved(_bidi_cookie(expiry=expiry))
    assert saved is not None
    assert "expires" not in saved


def test_odd_flags_and_same_site_are_not_trusted() -> None:
    saved = cookie_to_saved(_bidi_cookie(httpOnly="yes", secure=1, sameSite="Strict"))
    assert saved is not None
    assert saved["httpOnly"] is False and saved["secure"] is False
    assert "sameSite" not in saved
    back = cookie_to_bidi(saved)
    assert back["sameSite"] == "lax"
    assert cookie_to_bidi({**saved, "sameSite": "Bogus", "expires": -1.0}).get("expiry") is None
    assert cookie_to_bidi({**saved, "expires": True}).get("expiry") is None
    assert cookie_to_bidi({**saved, "expires": 1.9e9})["expiry"] == 1_900_000_000


def test_cookies_round_trip_through_a_checked_profile() -> None:
    """What export_profile saves (through parse_state) is what import_profile sets back."""
    raws = [_bidi_cookie(), _bidi_cookie(name="lax", sameSite="lax", secure=False, httpOnly=False),
            _bidi_cookie(name="unmarked", sameSite="none", secure=False, expiry=None),
            _bidi_cookie(name="bin", value={"type": "base64", "value": "AAEC"})]
    saved = [c for c in (cookie_to_saved(r) for r in raws) if c]
    state = parse_state({"cookies": saved, "tabs": ["https://example.test/"], "storage": {}})
    back = [cookie_to_bidi(c) for c in json.loads(json.dumps(state.to_json()))["cookies"]]
    assert [(c["name"], c["sameSite"], c["secure"], c.get("expiry")) for c in back] == [
        ("sid", "strict", True, 1_900_000_000), ("lax", "lax", False, 1_900_000_000),
        ("unmarked", "lax", False, None)]
    assert back[0] == {k: v for k, v in _bidi_cookie().items() if k != "size"}


@given(st.dictionaries(st.sampled_from(["name", "value", "domain", "path", "httpOnly", "secure",
                                        "sameSite", "expiry"]), _JSON))
def test_cookie_to_saved_never_raises(raw: dict[str, Any]) -> None:
    saved = cookie_to_saved(raw)
    if saved is not None:
        assert isinstance(saved["value"], str)
        assert saved.get("sameSite") in (None, "Strict", "Lax", "None")
        assert saved.get("sameSite") != "None" or saved["secure"] is True


# -- fit_jpeg ------------------------------------------------------------------------------------

def _image(fmt: str, w: int, h: int) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (w, h), (200, 30, 90)).save(buf, fmt)
    return buf.getvalue()


def test_a_large_png_is_scaled_into_the_box_as_jpeg() -> None:
    data, w, h = fit_jpeg(_image("PNG", 2560, 1600), 1280, 800, 70)
    assert (w, h) == (1280, 800)
    assert data[:3] == b"\xff\xd8\xff"
    with Image.open(io.BytesIO(data)) as img:
        assert img.format == "JPEG" and img.size == (1280, 800)


def test_the_aspect_ratio_is_kept() -> None:
    data, w, h = fit_jpeg(_image("PNG", 2000, 500), 1280, 800, 70)
    assert (w, h) == (1280, 320)
    with Image.open(io.BytesIO(data)) as img:
        assert img.size == (1280, 320)
    data, w, h = fit_jpeg(_image("JPEG", 400, 3000), 1280, 800, 70)
    assert (w, h) == (107, 800)
    with Image.open(io.BytesIO(data)) as img:
        assert img.format == "JPEG" and img.size == (107, 800)


def test_a_small_jpeg_comes_back_unchanged() -> None:
    src = _image("JPEG", 640, 400)
    data, w, h = fit_jpeg(src, 1280, 800, 70)
    assert data is src or data == src
    assert (w, h) == (640, 400)


def test_a_small_png_becomes_a_jpeg_of_the_same_size() -> None:
    data, w, h = fit_jpeg(_image("PNG", 640, 400), 1280, 800, 500)
    assert (w, h) == (640, 400)
    with Image.open(io.BytesIO(data)) as img:
        assert img.format == "JPEG" and img.size == (640, 400)


@pytest.mark.parametrize("data", [b"", b"garbage bytes, not an image", b"\x89PNG\r\n\x1a\n" + b"\0" * 40,
                                  b"\xff\xd8\xff" + b"\0" * 40])
def test_garbage_is_a_protocol_error(data: bytes) -> None:
    with pytest.raises(CDPProtocolError, match="captureScreenshot"):
        fit_jpeg(data, 1280, 800, 70)


def _chunk(kind: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))


def test_a_png_that_claims_a_huge_size_is_refused_before_decoding() -> None:
    # 40000 x 40000 in 60 bytes: Pillow's bomb check refuses it on open, nothing is decoded.
    header = struct.pack(">IIBBBBB", 40000, 40000, 8, 2, 0, 0, 0)
    data = b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", header) + _chunk(b"IDAT", zlib.compress(b"")) \
        + _chunk(b"IEND", b"")
    with pytest.raises(CDPProtocolError, match="does not decode"):
        fit_jpeg(data, 1280, 800, 70)


def test_other_image_formats_are_refused() -> None:
    with pytest.raises(CDPProtocolError, match="not a JPEG or PNG"):
        fit_jpeg(_image("GIF", 20, 20), 1280, 800, 70)


# -- user_js -------------------------------------------------------------------------------------

def test_user_js_lines() -> None:
    text = user_js({"a.b": True, "c.d": False, "e.f": "ignore", "g": 3, 'q"uote': 'x"y'})
    assert text == ('user_pref("a.b", true);\n'
                    'user_pref("c.d", false);\n'
                    'user_pref("e.f", "ignore");\n'
                    'user_pref("g", 3);\n'
                    'user_pref("q\\"uote", "x\\"y");\n')
    assert user_js({}) == ""


def test_the_default_prefs() -> None:
    lines = user_js().splitlines()
    assert len(lines) == len(FIREFOX_PREFS)
    assert 'user_pref("app.update.auto", false);' in lines
    assert 'user_pref("dom.events.testing.asyncClipboard", true);' in lines
    assert 'user_pref("browser.startup.homepage_override.mstone", "ignore");' in lines
    assert all(line.startswith('user_pref("') and line.endswith(");") for line in lines)


def _png_header(width: int, height: int) -> bytes:
    """A PNG that claims ``width`` x ``height`` (signature and IHDR only: nothing to decode)."""
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    chunk = b"IHDR" + ihdr
    head = b"\x89PNG\r\n\x1a\n" + struct.pack(">I", len(ihdr)) + chunk + struct.pack(">I", zlib.crc32(chunk))
    idat = b"IDAT" + zlib.compress(b"\0")
    return head + struct.pack(">I", len(idat) - 4) + idat + struct.pack(">I", zlib.crc32(idat))


def test_fit_jpeg_refuses_an_image_over_the_pixel_cap_before_decoding_it() -> None:
    from rigd.browser.firefox import MAX_PIXELS

    side = int(MAX_PIXELS**0.5) + 100  # over rigd's cap, under Pillow's own bomb limit
    assert side * side < 89_478_485
    with pytest.raises(CDPProtocolError, match="pixel cap"):
        fit_jpeg(_png_header(side, side), 1280, 800, 75)
