"""mobile_use: the Android verbs (RIGS.md §4).

- ``tap``: ``coordinate`` (device pixels).
- ``swipe``: ``start_coordinate`` and ``coordinate`` (the end, named as
  computer_use's drag); optional integer ``durationMs`` 50-5000, default 300
  as ``adb shell input swipe``.
- ``type``: ``text``, non-empty, at most 64 KiB of UTF-8.
- ``key``: ``text``, an alias (back, home, recents, enter, delete,
  backspace, tab, escape, search, menu, volume_up, volume_down, power; any
  case) or ``KEYCODE_[A-Z0-9_]+``; see :mod:`rigd.verbs.keys`. The field is
  ``text`` as in computer_use's ``key``.
- ``screenshot`` ○, ``ui_dump`` ○: no fields.
- ``install_apk``: ``path``, an absolute host path of an ``.apk`` file with
  no ``..`` segments. Only the syntax is checked here: the backend must still
  confine the resolved path (symlinks included) to the rig's worktree or the
  server's data directory.
- ``start_app``, ``stop_app``, ``clear_app_data``, ``uninstall_app``:
  ``package``, a Java package name of at least two segments
  (``com.example.app``), as Android requires of an application id.
- ``open_url``: ``url``, http(s) with a host and no credentials, or an app's
  own scheme (a deep link: ``myapp://...``, ``market://...``). ``file:``,
  ``javascript:`` and ``data:`` are refused.
- ``shell``: ``argv``, a non-empty list of strings, never a string. It runs
  inside Android, never through a host shell. ``adb shell`` joins its
  arguments into one line for the device's ``sh``, so the backend must quote
  each element.

No clipboard verbs: since Android 10 only the focused app may read the
clipboard, so ``clipboard_read``/``clipboard_write`` are refused saying so.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from rigd.verbs._args import VerbSpec, no_fields, swipe_duration, table
from rigd.verbs.base import SWIPE_MS_DEFAULT, MobileAction, Point
from rigd.verbs.keys import android_keycode
from rigd.verbs.masking import keep_if, keep_url, mask


@dataclass(frozen=True, slots=True)
class MobileTap(MobileAction):
    verb = "tap"
    coordinate: Point


@dataclass(frozen=True, slots=True)
class MobileSwipe(MobileAction):
    verb = "swipe"
    start: Point
    end: Point
    duration_ms: int = SWIPE_MS_DEFAULT


@dataclass(frozen=True, slots=True)
class MobileType(MobileAction):
    verb = "type"
    text: str = field(repr=False)


@dataclass(frozen=True, slots=True)
class MobileKey(MobileAction):
    """``keycode`` is always a ``KEYCODE_*`` name; aliases are resolved."""

    verb = "key"
    keycode: str


@dataclass(frozen=True, slots=True)
class MobileScreenshot(MobileAction):
    verb = "screenshot"
    observation = True


@dataclass(frozen=True, slots=True)
class MobileUiDump(MobileAction):
    verb = "ui_dump"
    observation = True


@dataclass(frozen=True, slots=True)
class MobileInstallApk(MobileAction):
    """``path`` is syntactically safe; the backend confines it (see module doc)."""

    verb = "install_apk"
    path: str


@dataclass(frozen=True, slots=True)
class MobileStartApp(MobileAction):
    verb = "start_app"
    package: str


@dataclass(frozen=True, slots=True)
class MobileStopApp(MobileAction):
    verb = "stop_app"
    package: str


@dataclass(frozen=True, slots=True)
class MobileClearAppData(MobileAction):
    verb = "clear_app_data"
    package: str


@dataclass(frozen=True, slots=True)
class MobileUninstallApp(MobileAction):
    verb = "uninstall_app"
    package: str


@dataclass(frozen=True, slots=True)
class MobileOpenUrl(MobileAction):
    verb = "open_url"
    url: str


@dataclass(frozen=True, slots=True)
class MobileShell(MobileAction):
    verb = "shell"
    argv: tuple[str, ...]


def _package_verb(cls: type[MobileStartApp | MobileStopApp | MobileClearAppData
                          | MobileUninstallApp]) -> VerbSpec:
    return VerbSpec(cls, ("package",), lambda a: cls(a.package("package")))


_SHELL_HINT = "shell runs argv inside Android, never through a host shell"
_DURATION = "the field is durationMs (milliseconds)"

VERBS = table(
    VerbSpec(MobileTap, ("coordinate",), lambda a: MobileTap(a.coordinate("coordinate"))),
    VerbSpec(
        MobileSwipe, ("start_coordinate", "coordinate", "durationMs"),
        lambda a: MobileSwipe(
            start=a.coordinate("start_coordinate"),
            end=a.coordinate("coordinate"),
            duration_ms=swipe_duration(a),
        ),
        refused={"duration": _DURATION, "duration_ms": _DURATION},
    ),
    VerbSpec(MobileType, ("text",), lambda a: MobileType(a.text("text")), audit={"text": mask}),
    VerbSpec(
        MobileKey, ("text",), lambda a: MobileKey(a.check("text", android_keycode)),
        audit={"text": keep_if(android_keycode)},
    ),
    VerbSpec(MobileScreenshot, (), no_fields(MobileScreenshot)),
    VerbSpec(MobileUiDump, (), no_fields(MobileUiDump)),
    VerbSpec(
        MobileInstallApk, ("path",),
        lambda a: MobileInstallApk(
            a.abs_path("path", allow_dotdot=False, suffix=".apk",
                       what="an absolute path to an .apk file")
        ),
    ),
    _package_verb(MobileStartApp),
    _package_verb(MobileStopApp),
    _package_verb(MobileClearAppData),
    _package_verb(MobileUninstallApp),
    VerbSpec(
        MobileOpenUrl, ("url",), lambda a: MobileOpenUrl(a.url("url", web_only=False)),
        audit={"url": keep_url},
    ),
    VerbSpec(
        MobileShell, ("argv",), lambda a: MobileShell(a.argv("argv", string_hint=_SHELL_HINT)),
        refused={"command": f"pass argv, a list of strings; {_SHELL_HINT}"},
    ),
)

#: Verbs other tools have that this one refuses on purpose, with the reason.
REFUSED_VERBS: dict[str, str] = {
    name: (
        "mobile_use has no clipboard verbs: since Android 10 only the focused app may "
        "read the clipboard; use type to enter text"
    )
    for name in ("clipboard_read", "clipboard_write")
}
