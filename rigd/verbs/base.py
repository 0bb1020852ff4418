"""Shared vocabulary of the verb parsers: the :class:`Action` base, the
:class:`ParseContext`, the small enums that actions carry, and the numeric
rules of RIGS.md §4 and §7 in one place. Data only, no I/O."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import ClassVar

from rigd.model import LIMITS, Display, Surface, Tool

#: A point in the rig's coordinate space: guest pixels (computer, android),
#: CSS pixels of the viewport (browser) or screen points (ios).
Point = tuple[int, int]


class Action:
    """Base of every typed action.

    Each concrete action is a frozen, slotted dataclass that names its
    ``tool`` and ``verb`` and says whether it is an ``observation`` (RIGS.md §4
    ○: allowed while a person holds control). Secret fields (typed text,
    stdin, env) are left out of ``repr`` so an action can be logged.
    """

    __slots__ = ()

    tool: ClassVar[Tool]
    verb: ClassVar[str]
    observation: ClassVar[bool] = False


class TerminalAction(Action):
    __slots__ = ()
    tool = Tool.TERMINAL_USE


class ComputerAction(Action):
    __slots__ = ()
    tool = Tool.COMPUTER_USE


class BrowserAction(Action):
    __slots__ = ()
    tool = Tool.BROWSER_USE


class MobileAction(Action):
    __slots__ = ()
    tool = Tool.MOBILE_USE


class IosAction(Action):
    __slots__ = ()
    tool = Tool.IOS_USE


@dataclass(frozen=True, slots=True)
class ParseContext:
    """What validation needs to know about the rig an action is for.

    ``display`` bounds coordinates (``None`` when unknown, e.g. a terminal, or
    an iOS rig before its first screenshot); ``surface`` is the rig's surface,
    used to refuse a tool that cannot drive it (``None`` skips the check).
    """

    display: Display | None = None
    surface: Surface | None = None


def is_observation(action: Action) -> bool:
    """True for verbs that only look (RIGS.md §4 ○); they stay allowed while a
    person holds control, every other verb is refused then."""
    return action.observation


class ScrollDirection(enum.StrEnum):
    UP = "up"
    DOWN = "down"
    LEFT = "left"
    RIGHT = "right"


class ClipboardSelection(enum.StrEnum):
    """X11 selections (RIGS.md §4 computer_use clipboard_read)."""

    CLIPBOARD = "clipboard"
    PRIMARY = "primary"
    XDND = "xdnd"


class ExtractKind(enum.StrEnum):
    A11Y = "a11y"
    DOM = "dom"
    CONSOLE = "console"


class HistoryDirection(enum.StrEnum):
    BACK = "back"
    FORWARD = "forward"


class IosModifier(enum.StrEnum):
    COMMAND = "command"
    CONTROL = "control"
    OPTION = "option"
    SHIFT = "shift"


def _display_max(surface: Surface) -> Display:
    limit = LIMITS[surface].display_max
    if limit is None:  # pragma: no cover - a broken LIMITS table, caught at import
        raise RuntimeError(f"LIMITS[{surface}] has no display ceiling")
    return limit


# --- numeric rules -----------------------------------------------------------

#: Typed text, fill text and clipboard text: at most this many UTF-8 bytes.
#: Well under the 256 KB RPC frame even when JSON escaping inflates it.
TEXT_MAX_BYTES = 64 * 1024
#: Key specifications (``ctrl+s alt+Tab …``), selectors, URLs and paths.
KEYS_MAX_CHARS = 1024
SELECTOR_MAX_CHARS = 4096
#: A mark id (rigd.marks) is at most this: a JSON integer every client reads exactly.
MARK_ID_MAX = 2**31 - 1
URL_MAX_CHARS = 8192
PATH_MAX_CHARS = 4096
#: Largest coordinate accepted when the display size is unknown: X11 and most
#: windowing systems use signed 16-bit coordinates.
COORD_MAX = 32767

#: hold_key and wait (RIGS.md §4: 0-60 s).
DURATION_MAX_S = 60
#: computer/browser scroll notches.
SCROLL_AMOUNT_MIN = 1
SCROLL_AMOUNT_MAX = 100
#: set_display (computer) and set_viewport (browser); ceilings from RIGS.md §7.
DESKTOP_MIN = Display(640, 480)
DESKTOP_MAX = _display_max(Surface.COMPUTER)
VIEWPORT_MIN = Display(320, 240)
VIEWPORT_MAX = _display_max(Surface.BROWSER)
#: terminal exec timeoutS (API.md: ≤ 3600).
EXEC_TIMEOUT_DEFAULT_S = 60.0
EXEC_TIMEOUT_MAX_S = 3600
#: browser wait_for timeoutS (RIGS.md §4: 0.1-30 s); default as Playwright's.
WAIT_FOR_MIN_S = 0.1
WAIT_FOR_MAX_S = 30
WAIT_FOR_DEFAULT_S = 30.0
#: mobile/ios swipe durationMs (RIGS.md §4: 50-5000 ms); default as adb's.
SWIPE_MS_MIN = 50
SWIPE_MS_MAX = 5000
SWIPE_MS_DEFAULT = 300
