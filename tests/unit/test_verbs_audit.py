"""What the action log stores: arguments kept, typed text masked."""

from __future__ import annotations

import hashlib
import json

import pytest

from rigd.verbs import audit_args

SECRET = "hunter2-Ω-secret"


def masked(text: str) -> dict[str, object]:
    return {"len": len(text), "sha256": hashlib.sha256(text.encode()).hexdigest()}


def dump(record: dict[str, object]) -> str:
    # Strict JSON, and encodable: the store writes it as UTF-8 text.
    text = json.dumps(record, allow_nan=False, ensure_ascii=False)
    text.encode("utf-8")
    return text


@pytest.mark.parametrize(
    ("tool", "payload", "field"),
    [
        ("computer_use", {"action": "type", "text": SECRET}, "text"),
        ("computer_use", {"action": "clipboard_write", "text": SECRET}, "text"),
        ("browser_use", {"action": "type", "text": SECRET}, "text"),
        ("browser_use", {"action": "fill", "selector": "#pw", "text": SECRET}, "text"),
        ("browser_use", {"action": "clipboard_write", "text": SECRET}, "text"),
        ("mobile_use", {"action": "type", "text": SECRET}, "text"),
        ("ios_use", {"action": "type", "text": SECRET}, "text"),
        ("terminal_use", {"action": "exec", "argv": ["cat"], "stdin": SECRET}, "stdin"),
    ],
)
def test_typed_text_is_masked_to_length_and_hash(
    tool: str, payload: dict[str, object], field: str
) -> None:
    record = audit_args(tool, payload)
    assert record[field] == masked(SECRET)
    assert record["action"] == payload["action"]
    assert SECRET not in dump(record)


def test_exec_keeps_command_and_masks_env_values() -> None:
    record = audit_args("terminal_use", {
        "action": "exec", "command": "make test", "cwd": "/work", "timeoutS": 30,
        "env": {"TOKEN": SECRET, "CI": "1"},
    })
    assert record == {
        "action": "exec", "command": "make test", "cwd": "/work", "timeoutS": 30,
        "env": {"TOKEN": masked(SECRET), "CI": masked("1")},
    }


def test_argv_is_kept() -> None:
    record = audit_args("terminal_use", {"action": "exec", "argv": ["git", "status"]})
    assert record == {"action": "exec", "argv": ["git", "status"]}
    record = audit_args("mobile_use", {"action": "shell", "argv": ["logcat", "-d"]})
    assert record == {"action": "shell", "argv": ["logcat", "-d"]}


def test_key_names_and_pointer_arguments_are_kept() -> None:
    assert audit_args("computer_use", {"action": "key", "text": "ctrl+s"}) == {
        "action": "key", "text": "ctrl+s",
    }
    assert audit_args("computer_use", {"action": "hold_key", "text": "shift", "duration": 2}) == {
        "action": "hold_key", "text": "shift", "duration": 2,
    }
    assert audit_args(
        "computer_use", {"action": "left_click", "coordinate": [1, 2], "text": "shift"}
    ) == {"action": "left_click", "coordinate": [1, 2], "text": "shift"}
    assert audit_args("browser_use", {"action": "key", "text": "Control+a"})["text"] == "Control+a"
    assert audit_args("mobile_use", {"action": "key", "text": "back"})["text"] == "back"
    assert audit_args("ios_use", {"action": "key", "text": "a", "modifiers": ["command"]}) == {
        "action": "key", "text": "a", "modifiers": ["command"],
    }


def test_malformed_key_text_is_masked() -> None:
    # Text that is no key spec may be a password typed into the wrong verb.
    for tool, verb in [
        ("computer_use", "key"), ("computer_use", "hold_key"), ("computer_use", "left_click"),
        ("browser_use", "key"), ("mobile_use", "key"), ("ios_use", "key"),
    ]:
        record = audit_args(tool, {"action": verb, "text": "pass: " + SECRET})
        assert record["text"] == masked("pass: " + SECRET), (tool, verb)


@pytest.mark.parametrize(
    "value",
    [
        [SECRET, "more"],
        {"value": SECRET},
        [[SECRET]],
        1234,
        12.5,
        True,
        None,
        10**5000,
        float("nan"),
    ],
    ids=["list", "object", "nested", "int", "float", "bool", "null", "huge-int", "nan"],
)
def test_secret_fields_in_the_wrong_shape_keep_only_their_type(value: object) -> None:
    record = audit_args("computer_use", {"action": "type", "text": value})
    text = dump(record)
    assert SECRET not in text
    assert "1234" not in text
    assert set(record) == {"action", "text"}
    assert isinstance(record["text"], dict)
    assert "masked" in record["text"]


def test_unknown_fields_and_verbs_and_tools_are_masked() -> None:
    record = audit_args("computer_use", {"action": "type", "txt": SECRET})
    assert record == {"action": "type", "txt": masked(SECRET)}
    record = audit_args("computer_use", {"action": "typo", "text": SECRET})
    assert record == {"action": "typo", "text": masked(SECRET)}
    record = audit_args("computer", {"action": "type", "text": SECRET})
    assert record == {"action": "type", "text": masked(SECRET)}
    record = audit_args("mobile_use", {"action": "clipboard_write", "text": SECRET})
    assert record["text"] == masked(SECRET)


def test_verb_that_is_no_verb_name_is_masked() -> None:
    record = audit_args("computer_use", {"action": SECRET})
    assert record["action"] == masked(SECRET)
    record = audit_args("computer_use", {"action": [SECRET]})
    assert record["action"] == {"masked": "array"}


def test_non_object_payloads() -> None:
    assert audit_args("computer_use", SECRET) == {"action": None, "payload": masked(SECRET)}
    assert audit_args("computer_use", None) == {"action": None, "payload": {"masked": "null"}}
    assert audit_args(None, [SECRET]) == {"action": None, "payload": {"masked": "array"}}


def test_url_credentials_are_masked() -> None:
    record = audit_args("browser_use", {"action": "navigate", "url": "https://bob:pw9@x.com/a"})
    text = dump(record)
    assert "pw9" not in text
    assert "bob" not in text
    assert record["url"] == {"url": "https://***@x.com/a", "userinfo": masked("bob:pw9")}
    assert audit_args("browser_use", {"action": "navigate", "url": "https://x.com/"}) == {
        "action": "navigate", "url": "https://x.com/",
    }


def test_kept_values_are_bounded_and_strict_json() -> None:
    record = audit_args("computer_use", {
        "action": "scroll",
        "coordinate": [10**400, float("inf")],
        "scroll_amount": float("nan"),
        "scroll_direction": "x" * 10_000,
    })
    text = dump(record)
    assert len(text) < 6000
    assert record["coordinate"] == [
        {"integer": "out of range", "bits": (10**400).bit_length()},
        {"number": "inf"},
    ]
    assert record["scroll_amount"] == {"number": "nan"}


def test_long_commands_keep_a_head_and_a_hash() -> None:
    command = "echo " + "x" * 5000
    record = audit_args("terminal_use", {"action": "exec", "command": command})
    kept = record["command"]
    assert isinstance(kept, dict)
    assert kept["head"] == command[:4096]
    assert kept["len"] == len(command)


def test_unpaired_surrogates_are_hashed_and_spelled_out() -> None:
    record = audit_args("computer_use", {"action": "type", "text": "a\ud800"})
    assert record["text"] == {
        "len": 2, "sha256": hashlib.sha256("a\ud800".encode("utf-8", "surrogatepass")).hexdigest(),
    }
    record = audit_args("browser_use", {"action": "wait_for", "selector": "a\ud800"})
    dump(record)


def test_many_fields_are_capped() -> None:
    payload: dict[str, object] = {"action": "screenshot"}
    payload.update({f"f{i}": i for i in range(200)})
    record = audit_args("computer_use", payload)
    assert len(record) == 1 + 64 + 1
    assert record["…"] == {"more": 136}
