"""mobile_use (Android): every verb, valid, and each of its rules broken."""

from __future__ import annotations

from typing import Any

import pytest

from rigd.errors import FieldError
from rigd.model import Display
from rigd.verbs import (
    Action,
    MobileClearAppData,
    MobileInstallApk,
    MobileKey,
    MobileOpenUrl,
    MobileScreenshot,
    MobileShell,
    MobileStartApp,
    MobileStopApp,
    MobileSwipe,
    MobileTap,
    MobileType,
    MobileUiDump,
    MobileUninstallApp,
    ParseContext,
    parse_action,
)

CTX = ParseContext(display=Display(1080, 1920))


def ok(payload: dict[str, Any]) -> Action:
    result = parse_action("mobile_use", payload, CTX)
    assert isinstance(result, Action), result
    return result


def err(payload: dict[str, Any]) -> FieldError:
    result = parse_action("mobile_use", payload, CTX)
    assert isinstance(result, FieldError), result
    return result


@pytest.mark.parametrize(
    ("payload", "expected"),
    [
        ({"action": "tap", "coordinate": [540, 1919]}, MobileTap((540, 1919))),
        (
            {"action": "swipe", "start_coordinate": [500, 1500], "coordinate": [500, 300]},
            MobileSwipe((500, 1500), (500, 300), 300),
        ),
        (
            {"action": "swipe", "start_coordinate": [0, 0], "coordinate": [1, 1],
             "durationMs": 50},
            MobileSwipe((0, 0), (1, 1), 50),
        ),
        (
            {"action": "swipe", "start_coordinate": [0, 0], "coordinate": [1, 1],
             "durationMs": 5000},
            MobileSwipe((0, 0), (1, 1), 5000),
        ),
        ({"action": "type", "text": "hello"}, MobileType("hello")),
        ({"action": "key", "text": "back"}, MobileKey("KEYCODE_BACK")),
        ({"action": "key", "text": "HOME"}, MobileKey("KEYCODE_HOME")),
        ({"action": "key", "text": "recents"}, MobileKey("KEYCODE_APP_SWITCH")),
        ({"action": "key", "text": "delete"}, MobileKey("KEYCODE_FORWARD_DEL")),
        ({"action": "key", "text": "backspace"}, MobileKey("KEYCODE_DEL")),
        ({"action": "key", "text": "volume_down"}, MobileKey("KEYCODE_VOLUME_DOWN")),
        ({"action": "key", "text": "KEYCODE_DPAD_UP"}, MobileKey("KEYCODE_DPAD_UP")),
        ({"action": "key", "text": "KEYCODE_0"}, MobileKey("KEYCODE_0")),
        ({"action": "screenshot"}, MobileScreenshot()),
        ({"action": "ui_dump"}, MobileUiDump()),
        (
            {"action": "install_apk", "path": "/work/tree/app-debug.apk"},
            MobileInstallApk("/work/tree/app-debug.apk"),
        ),
        ({"action": "start_app", "package": "com.example.app"}, MobileStartApp("com.example.app")),
        ({"action": "stop_app", "package": "org.a_b.C9"}, MobileStopApp("org.a_b.C9")),
        ({"action": "clear_app_data", "package": "a.b"}, MobileClearAppData("a.b")),
        ({"action": "uninstall_app", "package": "a.b.c"}, MobileUninstallApp("a.b.c")),
        (
            {"action": "open_url", "url": "https://example.com/"},
            MobileOpenUrl("https://example.com/"),
        ),
        ({"action": "open_url", "url": "myapp://item/42"}, MobileOpenUrl("myapp://item/42")),
        (
            {"action": "open_url", "url": "market://details?id=a.b"},
            MobileOpenUrl("market://details?id=a.b"),
        ),
        ({"action": "shell", "argv": ["logcat", "-d"]}, MobileShell(("logcat", "-d"))),
        (
            {"action": "shell", "argv": ["pm", "grant", "a.b", "android.permission.CAMERA"]},
            MobileShell(("pm", "grant", "a.b", "android.permission.CAMERA")),
        ),
    ],
)
def test_valid(payload: dict[str, Any], expected: Action) -> None:
    assert ok(payload) == expected


INSIDE = "must be two integers inside the 1080x1920 display"
PACKAGE = "must be a Java package name"


@pytest.mark.parametrize(
    ("payload", "field", "fragment"),
    [
        ({"action": "tap"}, "action.coordinate", "is required"),
        ({"action": "tap", "coordinate": [1080, 0]}, "action.coordinate", INSIDE),
        ({"action": "tap", "coordinate": [0, 1920]}, "action.coordinate", INSIDE),
        ({"action": "tap", "coordinate": [False, 1]}, "action.coordinate", INSIDE),
        ({"action": "swipe", "coordinate": [1, 1]}, "action.start_coordinate", "is required"),
        ({"action": "swipe", "start_coordinate": [1, 1]}, "action.coordinate", "is required"),
        (
            {"action": "swipe", "start_coordinate": [1, 1], "coordinate": [2, 2],
             "durationMs": 49},
            "action.durationMs", "must be between 50 and 5000 milliseconds",
        ),
        (
            {"action": "swipe", "start_coordinate": [1, 1], "coordinate": [2, 2],
             "durationMs": 5001},
            "action.durationMs", "must be between 50 and 5000 milliseconds",
        ),
        (
            {"action": "swipe", "start_coordinate": [1, 1], "coordinate": [2, 2],
             "durationMs": 300.5},
            "action.durationMs", "must be an integer",
        ),
        (
            {"action": "swipe", "start_coordinate": [1, 1], "coordinate": [2, 2], "duration": 1},
            "action.duration", "the field is durationMs",
        ),
        ({"action": "type"}, "action.text", "is required"),
        ({"action": "type", "text": ""}, "action.text", "must not be empty"),
        ({"action": "key", "text": "back_button"}, "action.text", "is not an Android key"),
        ({"action": "key", "text": "keycode_back"}, "action.text", "KEYCODE_*"),
        ({"action": "key", "text": "KEYCODE_"}, "action.text", "is not an Android key"),
        ({"action": "key", "text": "KEYCODE_back"}, "action.text", "is not an Android key"),
        ({"action": "key", "text": 4}, "action.text", "must be a string"),
        ({"action": "install_apk"}, "action.path", "is required"),
        ({"action": "install_apk", "path": "app.apk"}, "action.path", "absolute path"),
        (
            {"action": "install_apk", "path": "/work/../etc/app.apk"},
            "action.path", "must not contain '..' segments",
        ),
        ({"action": "install_apk", "path": "/work/app.zip"}, "action.path", "an .apk file"),
        ({"action": "install_apk", "path": "/work/.apk"}, "action.path", "an .apk file"),
        ({"action": "install_apk", "path": "/w/a.apk\x00"}, "action.path", "NUL"),
        ({"action": "start_app"}, "action.package", "is required: a Java package name"),
        ({"action": "start_app", "package": "chrome"}, "action.package", PACKAGE),
        ({"action": "stop_app", "package": "com..x"}, "action.package", PACKAGE),
        ({"action": "clear_app_data", "package": "com.9x"}, "action.package", PACKAGE),
        ({"action": "uninstall_app", "package": "com.ex-ample"}, "action.package", PACKAGE),
        ({"action": "uninstall_app", "package": ["a.b"]}, "action.package", PACKAGE),
        ({"action": "open_url"}, "action.url", "is required"),
        ({"action": "open_url", "url": "file:///sdcard/x"}, "action.url", "'file' is not allowed"),
        ({"action": "open_url", "url": "javascript:1"}, "action.url", "is not allowed"),
        ({"action": "open_url", "url": "data:text/html,x"}, "action.url", "is not allowed"),
        ({"action": "open_url", "url": "https://a:b@x.com"}, "action.url", "credentials"),
        ({"action": "open_url", "url": "myapp:"}, "action.url", "absolute URL"),
        ({"action": "open_url", "url": "/relative"}, "action.url", "absolute URL"),
        ({"action": "shell"}, "action.argv", "is required"),
        ({"action": "shell", "argv": "logcat -d"}, "action.argv", "never through a host shell"),
        ({"action": "shell", "argv": []}, "action.argv", "must not be empty"),
        ({"action": "shell", "argv": ["ls", 1]}, "action.argv[1]", "must be a string"),
        ({"action": "shell", "command": "ls"}, "action.command", "pass argv"),
    ],
)
def test_invalid(payload: dict[str, Any], field: str, fragment: str) -> None:
    e = err(payload)
    assert e.field == field
    assert fragment in e.reason


@pytest.mark.parametrize("verb", ["clipboard_read", "clipboard_write"])
def test_no_clipboard_verbs_and_why(verb: str) -> None:
    e = err({"action": verb, "text": "x"})
    assert e.field == "action.action"
    assert "no clipboard verbs: since Android 10 only the focused app may read" in e.reason
