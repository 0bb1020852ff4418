"""ios_use: every verb, valid, and each of its rules broken."""

from __future__ import annotations

from typing import Any

import pytest

from rigd.errors import FieldError
from rigd.model import Display
from rigd.verbs import (
    Action,
    IosHome,
    IosInstallApp,
    IosKey,
    IosLock,
    IosModifier,
    IosOpenUrl,
    IosScreenshot,
    IosSpawn,
    IosStartApp,
    IosStopApp,
    IosSwipe,
    IosTap,
    IosType,
    IosUiDump,
    IosUninstallApp,
    IosUnlock,
    ParseContext,
    parse_action,
)

CTX = ParseContext(display=Display(393, 852))


def ok(payload: dict[str, Any], ctx: ParseContext = CTX) -> Action:
    result = parse_action("ios_use", payload, ctx)
    assert isinstance(result, Action), result
    return result


def err(payload: dict[str, Any]) -> FieldError:
    result = parse_action("ios_use", payload, CTX)
    assert isinstance(result, FieldError), result
    return result


@pytest.mark.parametrize(
    ("payload", "expected"),
    [
        ({"action": "tap", "coordinate": [196, 426]}, IosTap((196, 426))),
        (
            {"action": "swipe", "start_coordinate": [200, 700], "coordinate": [200, 100]},
            IosSwipe((200, 700), (200, 100), 300),
        ),
        (
            {"action": "swipe", "start_coordinate": [1, 1], "coordinate": [2, 2],
             "durationMs": 1000},
            IosSwipe((1, 1), (2, 2), 1000),
        ),
        ({"action": "type", "text": "こんにちは"}, IosType("こんにちは")),
        ({"action": "key", "text": "enter"}, IosKey("enter")),
        ({"action": "key", "text": "Backspace"}, IosKey("backspace")),
        ({"action": "key", "text": "up"}, IosKey("up")),
        ({"action": "key", "text": "A"}, IosKey("A")),
        (
            {"action": "key", "text": "a", "modifiers": ["command", "Shift"]},
            IosKey("a", (IosModifier.COMMAND, IosModifier.SHIFT)),
        ),
        ({"action": "key", "text": "tab", "modifiers": []}, IosKey("tab")),
        ({"action": "home"}, IosHome()),
        ({"action": "lock"}, IosLock()),
        ({"action": "unlock"}, IosUnlock()),
        ({"action": "screenshot"}, IosScreenshot()),
        ({"action": "ui_dump"}, IosUiDump()),
        (
            {"action": "install_app", "path": "/data/build/My App.app"},
            IosInstallApp("/data/build/My App.app"),
        ),
        ({"action": "install_app", "path": "/w/Foo.app/"}, IosInstallApp("/w/Foo.app")),
        (
            {"action": "start_app", "bundleId": "com.apple.mobilesafari"},
            IosStartApp("com.apple.mobilesafari"),
        ),
        ({"action": "stop_app", "bundleId": "com.my-co.App2"}, IosStopApp("com.my-co.App2")),
        ({"action": "uninstall_app", "bundleId": "a.b"}, IosUninstallApp("a.b")),
        ({"action": "open_url", "url": "https://apple.com/"}, IosOpenUrl("https://apple.com/")),
        ({"action": "open_url", "url": "maps://?q=cafe"}, IosOpenUrl("maps://?q=cafe")),
        ({"action": "spawn", "argv": ["launchctl", "list"]}, IosSpawn(("launchctl", "list"))),
    ],
)
def test_valid(payload: dict[str, Any], expected: Action) -> None:
    assert ok(payload) == expected


def test_points_unbounded_before_the_size_is_known() -> None:
    assert ok({"action": "tap", "coordinate": [2000, 3000]}, ParseContext()) == IosTap((2000, 3000))


MODS = "must be a list of distinct modifiers: command, control, option, shift"
BUNDLE = "must be a bundle identifier"


@pytest.mark.parametrize(
    ("payload", "field", "fragment"),
    [
        (
            {"action": "tap", "coordinate": [393, 0]},
            "action.coordinate", "must be two integers inside the 393x852 display",
        ),
        ({"action": "tap", "coordinate": [1.5, 2]}, "action.coordinate", "two integers"),
        (
            {"action": "swipe", "start_coordinate": [1, 1], "coordinate": [2, 2], "durationMs": 1},
            "action.durationMs", "between 50 and 5000 milliseconds",
        ),
        ({"action": "type", "text": ""}, "action.text", "must not be empty"),
        ({"action": "key"}, "action.text", "is required"),
        ({"action": "key", "text": "return"}, "action.text", "(did you mean enter?)"),
        ({"action": "key", "text": "ArrowUp"}, "action.text", "(did you mean up?)"),
        ({"action": "key", "text": "home"}, "action.text", "is not an iOS key"),
        ({"action": "key", "text": "ab"}, "action.text", "is not an iOS key"),
        ({"action": "key", "text": "a", "modifiers": "command"}, "action.modifiers", MODS),
        ({"action": "key", "text": "a", "modifiers": ["cmd"]}, "action.modifiers[0]", MODS),
        (
            {"action": "key", "text": "a", "modifiers": ["shift", "shift"]},
            "action.modifiers[1]", MODS,
        ),
        ({"action": "key", "text": "a", "modifiers": [1]}, "action.modifiers[0]", MODS),
        ({"action": "home", "button": "home"}, "action.button", "it takes no fields"),
        ({"action": "install_app", "path": "Foo.app"}, "action.path", "absolute path"),
        ({"action": "install_app", "path": "/w/Foo.ipa"}, "action.path", ".app directory"),
        ({"action": "install_app", "path": "/w/../Foo.app"}, "action.path", "'..' segments"),
        ({"action": "install_app", "path": "/"}, "action.path", ".app directory"),
        ({"action": "start_app"}, "action.bundleId", "is required: a bundle identifier"),
        ({"action": "start_app", "bundleId": "safari"}, "action.bundleId", BUNDLE),
        ({"action": "stop_app", "bundleId": "com.x_y"}, "action.bundleId", BUNDLE),
        ({"action": "uninstall_app", "bundleId": "com..x"}, "action.bundleId", BUNDLE),
        (
            {"action": "start_app", "bundle_id": "com.a.b"},
            "action.bundle_id", "the field is bundleId",
        ),
        ({"action": "open_url", "url": "file:///x"}, "action.url", "is not allowed"),
        ({"action": "spawn", "argv": "ls"}, "action.argv", "never through a host shell"),
        ({"action": "spawn", "argv": [""]}, "action.argv[0]", "names the program"),
    ],
)
def test_invalid(payload: dict[str, Any], field: str, fragment: str) -> None:
    e = err(payload)
    assert e.field == field
    assert fragment in e.reason


@pytest.mark.parametrize("verb", ["clipboard_read", "clipboard_write"])
def test_no_clipboard_verbs(verb: str) -> None:
    e = err({"action": verb})
    assert e.field == "action.action"
    assert "ios_use has no clipboard verbs" in e.reason
