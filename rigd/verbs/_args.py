"""Field readers shared by the verb parsers.

How this works: :class:`Args` wraps one payload object. Each reader takes a
field name, applies one rule (type, range, syntax) and returns a typed value
or raises :class:`FieldError` naming ``action.<field>`` and the rule. Only
:func:`rigd.verbs.parse.parse_action` catches those, so a verb parser reads
like a list of rules. A field whose value is JSON ``null`` counts as absent:
OpenAI strict function calling sends ``null`` for every optional parameter
it does not use.

No reader ever formats a value it has not bounded first: error messages
quote at most a few dozen characters, never typed text, and never an
integer that could be too long to print.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TypeGuard, TypeVar
from urllib.parse import urlsplit

from rigd.errors import FieldError
from rigd.model import Tool
from rigd.verbs.base import (
    COORD_MAX,
    MARK_ID_MAX,
    PATH_MAX_CHARS,
    SWIPE_MS_DEFAULT,
    SWIPE_MS_MAX,
    SWIPE_MS_MIN,
    TEXT_MAX_BYTES,
    URL_MAX_CHARS,
    Action,
    ParseContext,
    Point,
)
from rigd.verbs.keys import KeySyntaxError
from rigd.verbs.masking import AuditFn

E = TypeVar("E", bound=StrEnum)
T = TypeVar("T")

_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
#: Java package names as Android accepts them for an application id: at
#: least two dot-separated segments, each a letter then letters, digits or _.
_PACKAGE = re.compile(r"[A-Za-z][A-Za-z0-9_]*(?:\.[A-Za-z][A-Za-z0-9_]*)+")
#: Apple bundle identifiers: reverse-DNS of letters, digits and hyphens.
_BUNDLE_ID = re.compile(r"[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)+")
_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*")
_SURROGATE = "must be valid Unicode text (it holds an unpaired surrogate)"
_VAR_NAME = "is not a valid variable name: letters, digits and _, not starting with a digit"
#: Printed numbers in messages stay below this magnitude.
_SHOW_INT_MAX = 10**9


def show(value: str, limit: int = 40) -> str:
    """A short, escaped quotation of a non-secret string for a message."""
    return repr(value if len(value) <= limit else value[:limit] + "…")


def field_path(base: str, key: object) -> str:
    """``base.key`` for identifier-like keys, ``base["odd key"]`` otherwise."""
    if isinstance(key, str) and _IDENT.fullmatch(key):
        return f"{base}.{key}"
    if isinstance(key, str):
        return f"{base}[{json.dumps(key if len(key) <= 64 else key[:64] + '…')}]"
    return f"{base}[<{type(key).__name__}>]"


def is_int(value: object) -> TypeGuard[int]:
    """JSON integers only: ``True`` is a boolean here, not 1."""
    return isinstance(value, int) and not isinstance(value, bool)


def _num(value: float) -> str:
    return f"{value:g}"


def utf8_size(text: str) -> int | None:
    """UTF-8 length of ``text``, or ``None`` if it holds an unpaired surrogate."""
    try:
        return len(text.encode("utf-8"))
    except UnicodeEncodeError:
        return None


class Args:
    """One verb's payload, read field by field with rules."""

    __slots__ = ("_raw", "ctx", "tool", "verb")

    def __init__(
        self, tool: Tool, verb: str, raw: Mapping[object, object], ctx: ParseContext
    ) -> None:
        self.tool = tool
        self.verb = verb
        self.ctx = ctx
        self._raw = raw

    def error(self, name: str, reason: str) -> FieldError:
        return FieldError(field_path("action", name), reason)

    def get(self, name: str) -> object:
        """The raw value, ``None`` when the field is absent or null."""
        return self._raw.get(name)

    def has(self, name: str) -> bool:
        return self._raw.get(name) is not None

    def check(self, name: str, parse: Callable[[str], T]) -> T:
        """Apply a key-syntax parser to a required string field."""
        value = self.string(name, max_chars=None)
        try:
            return parse(value)
        except KeySyntaxError as exc:
            raise self.error(name, str(exc)) from None

    # --- strings -------------------------------------------------------------

    def _str(
        self,
        name: str,
        value: object,
        *,
        allow_empty: bool = False,
        allow_nul: bool = False,
        max_chars: int | None = 4096,
        max_bytes: int | None = None,
    ) -> str:
        if not isinstance(value, str):
            raise self.error(name, "must be a string")
        if not value and not allow_empty:
            raise self.error(name, "must not be empty")
        if not allow_nul and "\x00" in value:
            raise self.error(name, "must not contain NUL characters")
        if max_chars is not None and len(value) > max_chars:
            raise self.error(name, f"must be at most {max_chars} characters")
        size = utf8_size(value)
        if size is None:
            raise self.error(name, _SURROGATE)
        if max_bytes is not None and size > max_bytes:
            raise self.error(
                name, f"must be at most {max_bytes} bytes of UTF-8 ({max_bytes // 1024} KiB)"
            )
        return value

    def string(
        self,
        name: str,
        *,
        required_hint: str = "",
        allow_empty: bool = False,
        max_chars: int | None = 4096,
    ) -> str:
        value = self.get(name)
        if value is None:
            raise self.error(name, "is required" + (f": {required_hint}" if required_hint else ""))
        return self._str(name, value, allow_empty=allow_empty, max_chars=max_chars)

    def text(self, name: str, *, allow_empty: bool = False, allow_nul: bool = False,
             max_bytes: int | None = TEXT_MAX_BYTES) -> str:
        """Typed or pasted text: any Unicode, bounded in UTF-8 bytes. Reasons
        never quote it."""
        value = self.get(name)
        if value is None:
            raise self.error(name, "is required")
        return self._str(
            name, value, allow_empty=allow_empty, allow_nul=allow_nul,
            max_chars=None, max_bytes=max_bytes,
        )

    def opt_text(self, name: str, *, allow_empty: bool = True, allow_nul: bool = False,
                 max_bytes: int | None = TEXT_MAX_BYTES) -> str | None:
        if not self.has(name):
            return None
        return self.text(name, allow_empty=allow_empty, allow_nul=allow_nul, max_bytes=max_bytes)

    def pattern(self, name: str, regex: re.Pattern[str], rule: str, *, max_chars: int = 255) -> str:
        """A required string matching ``regex``; ``rule`` says what it must be."""
        value = self.get(name)
        if value is None:
            raise self.error(name, f"is required: {rule}")
        if not isinstance(value, str) or len(value) > max_chars or not regex.fullmatch(value):
            raise self.error(name, f"must be {rule}")
        return value

    def package(self, name: str) -> str:
        return self.pattern(
            name, _PACKAGE,
            "a Java package name such as com.example.app (letters, digits and _, "
            "dot-separated, each part starting with a letter)",
        )

    def bundle_id(self, name: str) -> str:
        return self.pattern(
            name, _BUNDLE_ID,
            "a bundle identifier such as com.apple.mobilesafari (letters, digits and "
            "hyphens, dot-separated)",
        )

    # --- scalars -------------------------------------------------------------

    def boolean(self, name: str, default: bool) -> bool:
        value = self.get(name)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise self.error(name, "must be true or false")
        return value

    def choice(self, name: str, kind: type[E], default: E | None = None) -> E:
        options = ", ".join(member.value for member in kind)
        value = self.get(name)
        if value is None:
            if default is None:
                raise self.error(name, f"is required: one of {options}")
            return default
        for member in kind:
            if value == member.value and isinstance(value, str):
                return member
        got = f" (got {show(value)})" if isinstance(value, str) else ""
        raise self.error(name, f"must be one of {options}{got}")

    def integer(self, name: str, lo: int, hi: int, *, unit: str = "",
                default: int | None = None) -> int:
        phrase = f"between {lo} and {hi}" + (f" {unit}" if unit else "")
        value = self.get(name)
        if value is None:
            if default is None:
                raise self.error(name, f"is required: an integer {phrase}")
            return default
        if not is_int(value):
            raise self.error(name, f"must be an integer {phrase}")
        if not lo <= value <= hi:
            raise self.error(name, f"must be {phrase}")
        return value

    def number(self, name: str, lo: float, hi: float, *, unit: str = "seconds",
               default: float | None = None, lo_open: bool = False) -> float:
        """A finite JSON number (int or float, never a boolean) in range."""
        if lo_open:
            phrase = f"more than {_num(lo)} and at most {_num(hi)} {unit}"
        else:
            phrase = f"between {_num(lo)} and {_num(hi)} {unit}"
        value = self.get(name)
        if value is None:
            if default is None:
                raise self.error(name, f"is required: a number {phrase}")
            return default
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise self.error(name, f"must be a number {phrase}")
        if isinstance(value, float) and not math.isfinite(value):
            raise self.error(name, f"must be a finite number {phrase}")
        # Compare before converting: float() of a huge int overflows.
        too_low = value <= lo if lo_open else value < lo
        if too_low or value > hi:
            raise self.error(name, f"must be {phrase}")
        return float(value)

    # --- coordinates ---------------------------------------------------------

    def _coordinate_rule(self) -> str:
        display = self.ctx.display
        if display is None:
            return f"must be two non-negative integers [x, y], each at most {COORD_MAX}"
        return f"must be two integers inside the {display.width}x{display.height} display"

    def _coordinate(self, name: str, value: object) -> Point:
        rule = self._coordinate_rule()
        if not isinstance(value, list | tuple) or len(value) != 2:
            raise self.error(name, rule)
        x, y = value
        if not (is_int(x) and is_int(y)):
            raise self.error(name, rule)
        display = self.ctx.display
        width, height = (
            (COORD_MAX + 1, COORD_MAX + 1) if display is None else (display.width, display.height)
        )
        if not (0 <= x < width and 0 <= y < height):
            got = ""
            if abs(x) < _SHOW_INT_MAX and abs(y) < _SHOW_INT_MAX:
                got = f" (got [{x}, {y}])"
            raise self.error(name, rule + got)
        return (x, y)

    def coordinate(self, name: str) -> Point:
        value = self.get(name)
        if value is None:
            raise self.error(name, "is required; " + self._coordinate_rule())
        return self._coordinate(name, value)

    def opt_mark(self, *, instead_of: str = "coordinate") -> int | None:
        """An optional ``mark``: an element id drawn on a marked screenshot (rigd.marks), given
        in place of ``instead_of``."""
        if not self.has("mark"):
            return None
        if self.has(instead_of):
            raise self.error("mark", f"give {instead_of} or mark, not both")
        return self.integer("mark", 1, MARK_ID_MAX)

    def opt_coordinate(self, name: str) -> Point | None:
        value = self.get(name)
        return None if value is None else self._coordinate(name, value)

    # --- processes -----------------------------------------------------------

    def argv(self, name: str, *, string_hint: str) -> tuple[str, ...]:
        """A non-empty list of strings; ``argv[0]`` names the program."""
        value = self.get(name)
        if value is None:
            raise self.error(name, "is required: a non-empty list of strings")
        if isinstance(value, str):
            raise self.error(name, f"must be a list of strings, not a string; {string_hint}")
        if not isinstance(value, list | tuple):
            raise self.error(name, "must be a non-empty list of strings")
        if not value:
            raise self.error(name, "must not be empty: argv[0] names the program")
        out: list[str] = []
        for index, item in enumerate(value):
            path = f"action.{name}[{index}]"
            if not isinstance(item, str):
                raise FieldError(path, "must be a string")
            if "\x00" in item:
                raise FieldError(path, "must not contain NUL characters")
            if utf8_size(item) is None:
                raise FieldError(path, _SURROGATE)
            out.append(item)
        if not out[0]:
            raise FieldError(f"action.{name}[0]", "must not be empty: it names the program")
        return tuple(out)

    def env(self, name: str) -> tuple[tuple[str, str], ...]:
        value = self.get(name)
        if value is None:
            return ()
        if not isinstance(value, Mapping):
            raise self.error(name, "must be an object mapping variable names to strings")
        out: list[tuple[str, str]] = []
        for key, item in value.items():
            path = field_path(f"action.{name}", key)
            if not isinstance(key, str) or not _ENV_NAME.fullmatch(key):
                raise FieldError(path, _VAR_NAME)
            if not isinstance(item, str):
                raise FieldError(path, "must be a string")
            if "\x00" in item:
                raise FieldError(path, "must not contain NUL characters")
            if utf8_size(item) is None:
                raise FieldError(path, _SURROGATE)
            out.append((key, item))
        return tuple(out)

    # --- paths and URLs ------------------------------------------------------

    def abs_path(self, name: str, *, allow_dotdot: bool, suffix: str | None = None,
                 what: str = "an absolute path") -> str:
        value = self.get(name)
        if value is None:
            raise self.error(name, f"is required: {what}")
        path = self._str(name, value, max_chars=PATH_MAX_CHARS)
        if not path.startswith("/"):
            raise self.error(name, f"must be {what} (starting with /)")
        if not allow_dotdot and ".." in path.split("/"):
            raise self.error(name, "must not contain '..' segments")
        if suffix is not None:
            path = path.rstrip("/") or "/"
            if not path.lower().endswith(suffix) or len(path.rsplit("/", 1)[-1]) <= len(suffix):
                raise self.error(name, f"must be {what}")
        return path

    def opt_abs_path(self, name: str, *, allow_dotdot: bool) -> str | None:
        if not self.has(name):
            return None
        return self.abs_path(name, allow_dotdot=allow_dotdot)

    def url(self, name: str, *, web_only: bool) -> str:
        value = self.get(name)
        rule = (
            "an http:// or https:// URL" if web_only
            else "an absolute URL: http(s)://… or an app's own scheme (a deep link)"
        )
        if value is None:
            raise self.error(name, f"is required: {rule}")
        url = self._str(name, value, max_chars=URL_MAX_CHARS)
        reason = url_problem(url, web_only=web_only)
        if reason is not None:
            raise self.error(name, reason)
        return url


#: Schemes open_url refuses: not places to open (javascript:, data:), or a
#: way around the install verbs' path confinement (file:).
REFUSED_SCHEMES = frozenset({"javascript", "data", "file"})


def url_problem(url: str, *, web_only: bool) -> str | None:
    """The rule ``url`` breaks, or ``None`` when it is acceptable."""
    if any(char.isspace() or ord(char) < 0x20 or ord(char) == 0x7F for char in url):
        return "must not contain spaces or control characters; percent-encode them"
    try:
        parts = urlsplit(url)
        host = parts.hostname
        _ = parts.port  # raises ValueError for a port out of range
        has_userinfo = parts.username is not None or parts.password is not None
    except ValueError:
        return "is not a valid URL"
    scheme = parts.scheme.lower()
    if not scheme or not _SCHEME.fullmatch(scheme) or not url[len(scheme) + 1:]:
        return (
            "must be an absolute URL with its scheme, e.g. https://example.com/"
            if web_only else
            "must be an absolute URL with its scheme: https://… or an app's own scheme"
        )
    if scheme in ("http", "https"):
        if not host:
            return f"must name a host: {scheme}://host/…"
        if has_userinfo:
            return (
                "must not carry credentials (user:password@host): action arguments are "
                "written to the audit log"
            )
        return None
    if web_only:
        return f"must be an http:// or https:// URL (got scheme {show(scheme, 16)})"
    if scheme in REFUSED_SCHEMES:
        return (
            f"scheme {show(scheme, 16)} is not allowed; use http, https or an app's own "
            "scheme (a deep link)"
        )
    return None


@dataclass(frozen=True, slots=True)
class VerbSpec:
    """One verb of one tool: its action type, its accepted fields, its parser,
    hints for fields it refuses, and how the audit log treats each field (a
    field not listed in ``audit`` is kept; a field not in ``fields`` is masked).
    """

    action_type: type[Action]
    fields: tuple[str, ...]
    parse: Callable[[Args], Action]
    refused: Mapping[str, str] = field(default_factory=dict)
    audit: Mapping[str, AuditFn] = field(default_factory=dict)

    @property
    def verb(self) -> str:
        return self.action_type.verb

    @property
    def tool(self) -> Tool:
        return self.action_type.tool

    @property
    def observation(self) -> bool:
        return self.action_type.observation


def swipe_duration(a: Args) -> int:
    """``durationMs`` of a mobile or iOS swipe."""
    return a.integer(
        "durationMs", SWIPE_MS_MIN, SWIPE_MS_MAX, unit="milliseconds", default=SWIPE_MS_DEFAULT
    )


def no_fields(cls: type[Action]) -> Callable[[Args], Action]:
    """The parser of a verb that takes no fields."""

    def parse(_: Args) -> Action:
        return cls()

    return parse


def table(*specs: VerbSpec) -> dict[str, VerbSpec]:
    """Verb name → spec, refusing duplicate verbs or a mix of tools."""
    out: dict[str, VerbSpec] = {}
    for spec in specs:
        if spec.verb in out or spec.tool is not specs[0].tool:
            raise RuntimeError(f"verb table: {spec.tool} {spec.verb} is misplaced")
        out[spec.verb] = spec
    return out
