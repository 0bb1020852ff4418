"""Total parsers for every ``*_use`` payload → typed actions or a field error.

Public API::

    parse_action(tool, payload, ctx=ParseContext()) -> Action | FieldError
    audit_args(tool, payload) -> dict[str, object]
    is_observation(action) -> bool

Each verb of each tool is one frozen, slotted dataclass (``ComputerLeftClick``,
``BrowserNavigate``, ``TerminalExec`` …) that knows its ``tool``, ``verb``
and ``observation`` flag. The per-tool modules document their verbs and the
decisions taken where RIGS.md §4 is silent:

- :mod:`rigd.verbs.terminal` — ``exec``
- :mod:`rigd.verbs.computer` — X11 desktop, Anthropic computer-use shape
- :mod:`rigd.verbs.browser` — headless browser, Playwright naming
- :mod:`rigd.verbs.mobile` — Android
- :mod:`rigd.verbs.ios` — iOS Simulator
- :mod:`rigd.verbs.keys` — key-name syntax per surface
- :mod:`rigd.verbs.audit` — what the action log stores

Conventions shared by all tools:

- The payload is a JSON object whose ``action`` names the verb. A field the
  verb does not take is refused by name (agents make typos; a silent ignore
  hides the bug). A field set to ``null`` counts as absent, so OpenAI strict
  function calling, which sends ``null`` for unused optional parameters of
  one flat schema, works — but a misspelt field is refused even when null.
- Coordinates are ``[x, y]``: two JSON integers (``true`` is not 1, ``3.0``
  is not 3), non-negative, inside ``ctx.display`` when it is known and at
  most 32767 otherwise. Drags and swipes take ``start_coordinate`` and
  ``coordinate`` (the end) on every tool, as Anthropic's ``left_click_drag``.
- Key verbs take their keys in ``text`` on every tool, as Anthropic's ``key``.
- Typed, filled and clipboard text: any Unicode without NUL or unpaired
  surrogates, at most 64 KiB of UTF-8 (``type`` needs at least one character;
  ``fill`` and ``clipboard_write`` may be empty, which clears).
- Errors: ``FieldError(field, reason)`` with ``field`` a dotted path under
  ``action`` (``action.coordinate``, ``action.env.FOO``, ``action.argv[2]``)
  or ``tool``; the reason states the rule, e.g. ``must be between 0 and 60
  seconds``. Reasons never quote typed text.
"""

from rigd.verbs.audit import audit_args
from rigd.verbs.base import (
    Action,
    BrowserAction,
    ClipboardSelection,
    ComputerAction,
    ExtractKind,
    HistoryDirection,
    IosAction,
    IosModifier,
    MobileAction,
    ParseContext,
    Point,
    ScrollDirection,
    TerminalAction,
    is_observation,
)
from rigd.verbs.browser import (
    BrowserClick,
    BrowserClipboardRead,
    BrowserClipboardWrite,
    BrowserDrag,
    BrowserExtract,
    BrowserFill,
    BrowserHistory,
    BrowserKey,
    BrowserLeftMouseDown,
    BrowserLeftMouseUp,
    BrowserMouseMove,
    BrowserNavigate,
    BrowserReload,
    BrowserScreenshot,
    BrowserScroll,
    BrowserSetViewport,
    BrowserStopLoading,
    BrowserType,
    BrowserWaitFor,
)
from rigd.verbs.computer import (
    ComputerClick,
    ComputerClipboardRead,
    ComputerClipboardWrite,
    ComputerCursorPosition,
    ComputerDoubleClick,
    ComputerHoldKey,
    ComputerKey,
    ComputerLeftClick,
    ComputerLeftClickDrag,
    ComputerLeftMouseDown,
    ComputerLeftMouseUp,
    ComputerMiddleClick,
    ComputerMouseMove,
    ComputerRightClick,
    ComputerScreenshot,
    ComputerScroll,
    ComputerSetDisplay,
    ComputerTripleClick,
    ComputerType,
    ComputerWait,
    ComputerZoom,
)
from rigd.verbs.ios import (
    IosHome,
    IosInstallApp,
    IosKey,
    IosLock,
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
)
from rigd.verbs.keys import KeyCombo
from rigd.verbs.mobile import (
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
)
from rigd.verbs.parse import OBSERVATION_VERBS, TOOL_VERBS, parse_action, verbs_of
from rigd.verbs.terminal import TerminalExec

__all__ = [
    "OBSERVATION_VERBS",
    "TOOL_VERBS",
    "Action",
    "BrowserAction",
    "BrowserClick",
    "BrowserClipboardRead",
    "BrowserClipboardWrite",
    "BrowserDrag",
    "BrowserExtract",
    "BrowserFill",
    "BrowserHistory",
    "BrowserKey",
    "BrowserLeftMouseDown",
    "BrowserLeftMouseUp",
    "BrowserMouseMove",
    "BrowserNavigate",
    "BrowserReload",
    "BrowserScreenshot",
    "BrowserScroll",
    "BrowserSetViewport",
    "BrowserStopLoading",
    "BrowserType",
    "BrowserWaitFor",
    "ClipboardSelection",
    "ComputerAction",
    "ComputerClick",
    "ComputerClipboardRead",
    "ComputerClipboardWrite",
    "ComputerCursorPosition",
    "ComputerDoubleClick",
    "ComputerHoldKey",
    "ComputerKey",
    "ComputerLeftClick",
    "ComputerLeftClickDrag",
    "ComputerLeftMouseDown",
    "ComputerLeftMouseUp",
    "ComputerMiddleClick",
    "ComputerMouseMove",
    "ComputerRightClick",
    "ComputerScreenshot",
    "ComputerScroll",
    "ComputerSetDisplay",
    "ComputerTripleClick",
    "ComputerType",
    "ComputerWait",
    "ComputerZoom",
    "ExtractKind",
    "HistoryDirection",
    "IosAction",
    "IosHome",
    "IosInstallApp",
    "IosKey",
    "IosLock",
    "IosModifier",
    "IosOpenUrl",
    "IosScreenshot",
    "IosSpawn",
    "IosStartApp",
    "IosStopApp",
    "IosSwipe",
    "IosTap",
    "IosType",
    "IosUiDump",
    "IosUninstallApp",
    "IosUnlock",
    "KeyCombo",
    "MobileAction",
    "MobileClearAppData",
    "MobileInstallApk",
    "MobileKey",
    "MobileOpenUrl",
    "MobileScreenshot",
    "MobileShell",
    "MobileStartApp",
    "MobileStopApp",
    "MobileSwipe",
    "MobileTap",
    "MobileType",
    "MobileUiDump",
    "MobileUninstallApp",
    "ParseContext",
    "Point",
    "ScrollDirection",
    "TerminalAction",
    "TerminalExec",
    "audit_args",
    "is_observation",
    "parse_action",
    "verbs_of",
]
