"""terminal_use exec: valid calls, and each rule broken."""

from __future__ import annotations

from typing import Any

import pytest

from rigd.errors import FieldError
from rigd.verbs import Action, ParseContext, TerminalExec, parse_action

CTX = ParseContext()


def ok(payload: dict[str, Any]) -> TerminalExec:
    result = parse_action("terminal_use", payload, CTX)
    assert isinstance(result, TerminalExec), result
    return result


def err(payload: dict[str, Any]) -> FieldError:
    result = parse_action("terminal_use", payload, CTX)
    assert isinstance(result, FieldError), result
    return result


def test_argv() -> None:
    action = ok({"action": "exec", "argv": ["ls", "-l", ""]})
    assert action == TerminalExec(argv=("ls", "-l", ""), command=None)
    assert action.program == ("ls", "-l", "")
    assert action.timeout_s == 60.0
    assert action.stdin is None
    assert action.env == ()


def test_command_runs_under_bash_lc() -> None:
    action = ok({"action": "exec", "command": "make && ./run"})
    assert action.argv is None
    assert action.program == ("bash", "-lc", "make && ./run")


def test_every_option() -> None:
    action = ok({
        "action": "exec",
        "command": "cat",
        "cwd": "/work/../tmp",
        "env": {"FOO": "1", "_bar9": "x y", "EMPTY": ""},
        "stdin": "line\x00with nul ✓",
        "timeoutS": 3600,
    })
    assert action.cwd == "/work/../tmp"
    assert action.env_dict == {"FOO": "1", "_bar9": "x y", "EMPTY": ""}
    assert action.stdin == "line\x00with nul ✓".encode()
    assert action.timeout_s == 3600.0


def test_small_timeout_and_empty_stdin() -> None:
    action = ok({"action": "exec", "argv": ["true"], "timeoutS": 0.001, "stdin": ""})
    assert action.timeout_s == 0.001
    assert action.stdin == b""


def test_repr_hides_stdin_and_env() -> None:
    text = repr(ok({"action": "exec", "argv": ["x"], "stdin": "pw1", "env": {"T": "tok2"}}))
    assert "pw1" not in text
    assert "tok2" not in text


@pytest.mark.parametrize(
    ("payload", "field", "fragment"),
    [
        ({"action": "exec"}, "action.argv", "give argv (a list of strings) or command"),
        ({"action": "exec", "argv": None, "command": None}, "action.argv", "is required"),
        (
            {"action": "exec", "argv": ["ls"], "command": "ls"},
            "action.command", "give argv or command, not both",
        ),
        ({"action": "exec", "argv": []}, "action.argv", "must not be empty"),
        ({"action": "exec", "argv": "ls -l"}, "action.argv", "pass it as command instead"),
        ({"action": "exec", "argv": {"0": "ls"}}, "action.argv", "must be a non-empty list"),
        ({"action": "exec", "argv": ["ls", 3]}, "action.argv[1]", "must be a string"),
        ({"action": "exec", "argv": ["ls", "-l", None]}, "action.argv[2]", "must be a string"),
        ({"action": "exec", "argv": ["ls", "a\x00b"]}, "action.argv[1]", "NUL"),
        ({"action": "exec", "argv": ["ls", "\udc80"]}, "action.argv[1]", "unpaired surrogate"),
        ({"action": "exec", "argv": ["", "x"]}, "action.argv[0]", "it names the program"),
        ({"action": "exec", "command": ""}, "action.command", "must not be empty"),
        ({"action": "exec", "command": ["ls"]}, "action.command", "must be a string"),
        ({"action": "exec", "command": "ls\x00"}, "action.command", "NUL"),
        ({"action": "exec", "command": "ls", "cwd": "work"}, "action.cwd", "absolute path"),
        ({"action": "exec", "command": "ls", "cwd": ""}, "action.cwd", "must not be empty"),
        ({"action": "exec", "command": "ls", "cwd": 7}, "action.cwd", "must be a string"),
        (
            {"action": "exec", "command": "ls", "env": ["FOO=1"]},
            "action.env", "must be an object mapping variable names to strings",
        ),
        (
            {"action": "exec", "command": "ls", "env": {"FOO": 1}},
            "action.env.FOO", "must be a string",
        ),
        (
            {"action": "exec", "command": "ls", "env": {"FOO": "a\x00"}},
            "action.env.FOO", "NUL",
        ),
        (
            {"action": "exec", "command": "ls", "env": {"1X": "a"}},
            'action.env["1X"]', "is not a valid variable name",
        ),
        (
            {"action": "exec", "command": "ls", "env": {"A-B": "a"}},
            'action.env["A-B"]', "is not a valid variable name",
        ),
        (
            {"action": "exec", "command": "ls", "env": {"": "a"}},
            'action.env[""]', "is not a valid variable name",
        ),
        ({"action": "exec", "command": "ls", "stdin": 5}, "action.stdin", "must be a string"),
        (
            {"action": "exec", "command": "ls", "stdin": ["a"]},
            "action.stdin", "must be a string",
        ),
        (
            {"action": "exec", "command": "ls", "timeoutS": 0},
            "action.timeoutS", "must be more than 0 and at most 3600 seconds",
        ),
        (
            {"action": "exec", "command": "ls", "timeoutS": 3600.5},
            "action.timeoutS", "must be more than 0 and at most 3600 seconds",
        ),
        (
            {"action": "exec", "command": "ls", "timeoutS": -1},
            "action.timeoutS", "more than 0",
        ),
        (
            {"action": "exec", "command": "ls", "timeoutS": "60"},
            "action.timeoutS", "must be a number",
        ),
        (
            {"action": "exec", "command": "ls", "timeoutS": False},
            "action.timeoutS", "must be a number",
        ),
        (
            {"action": "exec", "command": "ls", "timeoutS": float("-inf")},
            "action.timeoutS", "finite",
        ),
        (
            {"action": "exec", "command": "ls", "timeout": 5},
            "action.timeout", "the field is timeoutS",
        ),
        ({"action": "exec", "command": "ls", "shell": True}, "action.shell", "unknown field"),
        ({"action": "run", "command": "ls"}, "action.action", "unknown terminal_use verb 'run'"),
    ],
)
def test_invalid(payload: dict[str, Any], field: str, fragment: str) -> None:
    e = err(payload)
    assert e.field == field
    assert fragment in e.reason


def test_parse_is_deterministic() -> None:
    payload = {"action": "exec", "argv": ["echo", "hi"], "env": {"A": "1"}}
    first: Action | FieldError = parse_action("terminal_use", payload)
    assert first == parse_action("terminal_use", payload)


def test_a_computer_rig_runs_exec_as_its_desktop_user_in_its_session_unless_root_is_asked() -> None:
    from rigd.errors import FieldError as FE
    from rigd.model import DESKTOP_SESSION_USER
    from rigd.verbs.terminal import SESSION_WRAP, as_user

    parsed = parse_action("terminal_use", {"action": "exec", "command": "chromium https://a.test/",
                                           "env": {"A": "1"}})
    assert isinstance(parsed, TerminalExec) and parsed.user is None
    wrapped = as_user(parsed, DESKTOP_SESSION_USER)
    assert wrapped.program == ("bash", "-c", SESSION_WRAP, "rigd-session", "rig", "A=1", "--",
                               "bash", "-lc", "chromium https://a.test/")
    assert wrapped.cwd == "/home/rig" and wrapped.env == () and wrapped.command is None
    assert "setpriv --reuid=\"$u\"" in SESSION_WRAP and "xfce4-session" in SESSION_WRAP
    root = parse_action("terminal_use", {"action": "exec", "argv": ["id"], "user": "root", "cwd": "/tmp"})
    assert isinstance(root, TerminalExec) and as_user(root, DESKTOP_SESSION_USER) is root
    # A terminal (or browser) rig runs as root, and takes no other user.
    assert as_user(parsed, None) is parsed
    other = parse_action("terminal_use", {"action": "exec", "argv": ["id"], "user": "rig"})
    assert isinstance(other, TerminalExec)
    with pytest.raises(FE) as info:
        as_user(other, None)
    assert info.value.field == "action.user" and "root" in info.value.message
    stranger = parse_action("terminal_use", {"action": "exec", "argv": ["id"], "user": "mallory"})
    assert isinstance(stranger, TerminalExec)
    with pytest.raises(FE, match=r"rig .its desktop's user, the default. or root"):
        as_user(stranger, DESKTOP_SESSION_USER)
    bad = parse_action("terminal_use", {"action": "exec", "argv": ["id"], "user": "Root; rm"})
    assert isinstance(bad, FE) and bad.field == "action.user"


@pytest.mark.skipif(__import__("os").geteuid() != 0, reason="setpriv to another user needs root")
def test_the_session_wrapper_runs_as_the_user_with_the_callers_env_over_the_defaults() -> None:
    import subprocess

    from rigd.verbs.terminal import SESSION_WRAP

    out = subprocess.run(["bash", "-c", SESSION_WRAP, "rigd-session", "nobody", "A=x y", "DISPLAY=:7", "--",
                          "sh", "-c", 'printf "%s|%s|%s|%s" "$(id -un)" "$A" "$DISPLAY" "$HOME"'],
                         capture_output=True, text=True, timeout=20, check=True)
    assert out.stdout == "nobody|x y|:7|/home/nobody"
