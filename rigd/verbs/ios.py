"""ios_use: the iOS Simulator verbs (RIGS.md §4).

- ``tap``: ``coordinate`` in iOS screen points, not screenshot pixels.
- ``swipe``: ``start_coordinate`` and ``coordinate`` (the end); optional
  integer ``durationMs`` 50-5000, default 300.
- ``type``: ``text``, non-empty, at most 64 KiB of UTF-8.
- ``key``: ``text``, one of enter, backspace, tab, escape, up, down, left,
  right (any case) or one printable character; optional ``modifiers``, a
  list of distinct command, control, option, shift.
- ``home``, ``lock``, ``unlock``: no fields.
- ``screenshot`` ○, ``ui_dump`` ○: no fields.
- ``install_app``: ``path``, an absolute host path of a simulator ``.app``
  directory (a trailing ``/`` is dropped) with no ``..`` segments. Only the
  syntax is checked here: the backend must still confine the resolved path
  to the rig's worktree or the server's data directory.
- ``start_app``, ``stop_app``, ``uninstall_app``: ``bundleId``, reverse-DNS
  of letters, digits and hyphens (``com.apple.mobilesafari``).
- ``open_url``: ``url``, as mobile_use's (http(s) or an app's own scheme;
  no credentials; not file, javascript or data).
- ``spawn``: ``argv``, a non-empty list of strings, run in the simulator by
  ``simctl spawn``, never through a host shell.

No clipboard verbs (RIGS.md lists none): people reach the simulator
pasteboard on the clipboard lane; an agent types text instead.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from rigd.errors import FieldError
from rigd.verbs._args import Args, VerbSpec, no_fields, swipe_duration, table
from rigd.verbs.base import SWIPE_MS_DEFAULT, IosAction, IosModifier, Point
from rigd.verbs.keys import ios_key
from rigd.verbs.masking import keep_if, keep_url, mask


@dataclass(frozen=True, slots=True)
class IosTap(IosAction):
    verb = "tap"
    coordinate: Point


@dataclass(frozen=True, slots=True)
class IosSwipe(IosAction):
    verb = "swipe"
    start: Point
    end: Point
    duration_ms: int = SWIPE_MS_DEFAULT


@dataclass(frozen=True, slots=True)
class IosType(IosAction):
    verb = "type"
    text: str = field(repr=False)


@dataclass(frozen=True, slots=True)
class IosKey(IosAction):
    """``key`` is a lower-case key name or a single character."""

    verb = "key"
    key: str
    modifiers: tuple[IosModifier, ...] = ()


@dataclass(frozen=True, slots=True)
class IosHome(IosAction):
    verb = "home"


@dataclass(frozen=True, slots=True)
class IosLock(IosAction):
    verb = "lock"


@dataclass(frozen=True, slots=True)
class IosUnlock(IosAction):
    verb = "unlock"


@dataclass(frozen=True, slots=True)
class IosScreenshot(IosAction):
    verb = "screenshot"
    observation = True


@dataclass(frozen=True, slots=True)
class IosUiDump(IosAction):
    verb = "ui_dump"
    observation = True


@dataclass(frozen=True, slots=True)
class IosInstallApp(IosAction):
    """``path`` is syntactically safe; the backend confines it (see module doc)."""

    verb = "install_app"
    path: str


@dataclass(frozen=True, slots=True)
class IosStartApp(IosAction):
    verb = "start_app"
    bundle_id: str


@dataclass(frozen=True, slots=True)
class IosStopApp(IosAction):
    verb = "stop_app"
    bundle_id: str


@dataclass(frozen=True, slots=True)
class IosUninstallApp(IosAction):
    verb = "uninstall_app"
    bundle_id: str


@dataclass(frozen=True, slots=True)
class IosOpenUrl(IosAction):
    verb = "open_url"
    url: str


@dataclass(frozen=True, slots=True)
class IosSpawn(IosAction):
    verb = "spawn"
    argv: tuple[str, ...]


_MODIFIER_RULE = "must be a list of distinct modifiers: command, control, option, shift"


def _modifiers(a: Args) -> tuple[IosModifier, ...]:
    value = a.get("modifiers")
    if value is None:
        return ()
    if not isinstance(value, list | tuple):
        raise a.error("modifiers", _MODIFIER_RULE)
    out: list[IosModifier] = []
    for index, item in enumerate(value):
        folded = item.lower() if isinstance(item, str) else None
        modifier = next((m for m in IosModifier if m.value == folded), None)
        if modifier is None or modifier in out:
            raise FieldError(f"action.modifiers[{index}]", _MODIFIER_RULE)
        out.append(modifier)
    return tuple(out)


def _key(a: Args) -> IosKey:
    return IosKey(key=a.check("text", ios_key), modifiers=_modifiers(a))


def _bundle_verb(cls: type[IosStartApp | IosStopApp | IosUninstallApp]) -> VerbSpec:
    return VerbSpec(
        cls, ("bundleId",), lambda a: cls(a.bundle_id("bundleId")),
        refused={"bundle_id": "the field is bundleId", "package": "the field is bundleId"},
    )


_SPAWN_HINT = "spawn runs argv inside the simulator, never through a host shell"
_DURATION = "the field is durationMs (milliseconds)"

VERBS = table(
    VerbSpec(IosTap, ("coordinate",), lambda a: IosTap(a.coordinate("coordinate"))),
    VerbSpec(
        IosSwipe, ("start_coordinate", "coordinate", "durationMs"),
        lambda a: IosSwipe(
            start=a.coordinate("start_coordinate"),
            end=a.coordinate("coordinate"),
            duration_ms=swipe_duration(a),
        ),
        refused={"duration": _DURATION, "duration_ms": _DURATION},
    ),
    VerbSpec(IosType, ("text",), lambda a: IosType(a.text("text")), audit={"text": mask}),
    VerbSpec(IosKey, ("text", "modifiers"), _key, audit={"text": keep_if(ios_key)}),
    VerbSpec(IosHome, (), no_fields(IosHome)),
    VerbSpec(IosLock, (), no_fields(IosLock)),
    VerbSpec(IosUnlock, (), no_fields(IosUnlock)),
    VerbSpec(IosScreenshot, (), no_fields(IosScreenshot)),
    VerbSpec(IosUiDump, (), no_fields(IosUiDump)),
    VerbSpec(
        IosInstallApp, ("path",),
        lambda a: IosInstallApp(
            a.abs_path("path", allow_dotdot=False, suffix=".app",
                       what="an absolute path to a simulator .app directory")
        ),
    ),
    _bundle_verb(IosStartApp),
    _bundle_verb(IosStopApp),
    _bundle_verb(IosUninstallApp),
    VerbSpec(
        IosOpenUrl, ("url",), lambda a: IosOpenUrl(a.url("url", web_only=False)),
        audit={"url": keep_url},
    ),
    VerbSpec(
        IosSpawn, ("argv",), lambda a: IosSpawn(a.argv("argv", string_hint=_SPAWN_HINT)),
        refused={"command": f"pass argv, a list of strings; {_SPAWN_HINT}"},
    ),
)

#: Verbs other tools have that this one refuses on purpose, with the reason.
REFUSED_VERBS: dict[str, str] = {
    name: (
        "ios_use has no clipboard verbs: the simulator pasteboard is reached on the "
        "clipboard lane by people; use type to enter text"
    )
    for name in ("clipboard_read", "clipboard_write")
}
