"""Total parsers for RPC method parameters (pure; no I/O).

Each returns a typed value or raises :class:`FieldError` naming the field and
the rule. The RPC layer turns that into a JSON-RPC error, never a 500.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any, Literal, overload

from rigd.browser.profiles import parse_profile_name
from rigd.errors import FieldError
from rigd.model import (
    BUILT_ENGINES,
    BUILT_SURFACES,
    DEFAULT_ENGINE,
    ENGINE_MEMORY_MB,
    LIMITS,
    Backend,
    Display,
    Engine,
    Surface,
)
from rigd.ports.names import dev_name_problem

ID_RE = re.compile(r"^[A-Za-z0-9_.:-]{1,128}$")

SURFACE_BACKENDS: dict[Surface, tuple[Backend, ...]] = {
    Surface.TERMINAL: (Backend.SMOLVM,),
    Surface.BROWSER: (Backend.SMOLVM,),
    Surface.COMPUTER: (Backend.QEMU_KVM, Backend.QEMU_HVF, Backend.QEMU_TCG),
    Surface.ANDROID: (Backend.ANDROID_EMULATOR,),
    Surface.IOS: (Backend.IOS_SIMULATOR,),
}


def obj(params: object, field: str = "params") -> dict[str, Any]:
    if params is None:
        return {}
    if not isinstance(params, dict):
        raise FieldError(field, "must be an object")
    return params


def no_extra(params: dict[str, Any], allowed: set[str], prefix: str = "") -> None:
    extra = sorted(k for k in params if k not in allowed)
    if extra:
        raise FieldError(prefix + extra[0], f"unknown field; allowed: {', '.join(sorted(allowed))}")


@overload
def string(params: dict[str, Any], name: str, *, required: Literal[True] = True, max_len: int = 256,
           field: str | None = None) -> str: ...


@overload
def string(params: dict[str, Any], name: str, *, required: bool, max_len: int = 256,
           field: str | None = None) -> str | None: ...


def string(params: dict[str, Any], name: str, *, required: bool = True, max_len: int = 256,
           field: str | None = None) -> str | None:
    field = field or name
    value = params.get(name)
    if value is None:
        if required:
            raise FieldError(field, "is required")
        return None
    if not isinstance(value, str) or not value or len(value) > max_len:
        raise FieldError(field, f"must be a non-empty string of at most {max_len} characters")
    return value


@overload
def ident(params: dict[str, Any], name: str, *, required: Literal[True] = True) -> str: ...


@overload
def ident(params: dict[str, Any], name: str, *, required: bool) -> str | None: ...


def ident(params: dict[str, Any], name: str, *, required: bool = True) -> str | None:
    value = string(params, name, required=required, max_len=128)
    if value is not None and not ID_RE.match(value):
        raise FieldError(name, "must be 1-128 characters of letters, digits, and _ . : -")
    return value


def integer(params: dict[str, Any], name: str, lo: int, hi: int, default: int, unit: str = "") -> int:
    value = params.get(name)
    if value is None:
        return default
    if isinstance(value, float) and value.is_integer() and math.isfinite(value):
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool) or not lo <= value <= hi:
        suffix = f" {unit}" if unit else ""
        raise FieldError(name, f"must be an integer between {lo} and {hi}{suffix}")
    return value


def boolean(params: dict[str, Any], name: str, default: bool) -> bool:
    value = params.get(name)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise FieldError(name, "must be true or false")
    return value


@dataclass(frozen=True, slots=True)
class OpenParams:
    workspace: str
    surface: Surface
    conversation: str | None
    engine: Engine | None
    backend: Backend
    display: Display | None
    memory_mb: int
    vcpus: int
    ttl_s: int
    idle_s: int
    egress_allow: tuple[str, ...]
    egress_defaults: bool
    wait: bool
    #: Whether the caller named the backend (else the server's accelerator chooses).
    backend_named: bool = False
    #: A browser rig's profile (the owner's; rigd.browser.profiles), or None: a clean start.
    profile: str | None = None
    #: A named snapshot of the workspace to resume (issue 29), or None.
    snapshot: str | None = None
    #: The workspace's volumes to attach (issue 29).
    volumes: tuple[VolumeRequest, ...] = ()
    #: The seat whose lasting rig this open opens or wakes (issue 29), or None.
    seat: str | None = None


OPEN_FIELDS = {
    "workspace", "surface", "conversation", "engine", "backend", "display", "memoryMb",
    "vcpus", "ttlS", "idleS", "egress", "wait", "profile", "snapshot", "volumes", "seat",
}

#: A seat's name: its volume is ``seat.<name>`` and its browser profile ``<name>``.
SEAT_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,47}")
SEAT_NAME_RULE = "1-48 letters, digits, '_' or '-', starting with a letter or digit"
#: Where a seat's volume is mounted in its rig.
SEAT_PATH = "/workspace"


def seat_name(params: dict[str, Any], name: str = "name") -> str:
    value = params.get(name)
    if not isinstance(value, str) or not SEAT_NAME_RE.fullmatch(value):
        raise FieldError(name, f"must be {SEAT_NAME_RULE}")
    return value

#: At most this many volumes per rig.
MAX_VOLUMES = 8
#: Guest trees a volume may not be mounted over (the system's own, the tools disk's).
RESERVED_MOUNTS = ("/proc", "/sys", "/dev", "/run", "/.rigd", "/boot", "/etc", "/usr", "/bin",
                   "/sbin", "/lib", "/lib64", "/var/lib/dpkg")


@dataclass(frozen=True, slots=True)
class VolumeRequest:
    """One of ``rig.open {volumes: [{name, path, readOnly}]}``."""

    name: str
    path: str
    read_only: bool = False


def volume_path_problem(path: object) -> str | None:
    """Why ``path`` is not where a volume may be mounted in the guest, or None."""
    if not isinstance(path, str) or not path:
        return "is required: an absolute path in the guest, such as /workspace"
    if len(path) > 200 or not re.fullmatch(r"(/[A-Za-z0-9._-]+)+", path):
        return ("must be an absolute path of letters, digits, '.', '_' and '-' (at most 200), "
                "such as /workspace")
    parts = path.split("/")[1:]
    if any(p in (".", "..") for p in parts):
        return "must be a plain path (no '.' or '..' parts)"
    for reserved in RESERVED_MOUNTS:
        if path == reserved or path.startswith(reserved + "/"):
            return f"is inside {reserved}, which the guest's system owns; mount volumes elsewhere"
    return None


def paths_overlap(a: str, b: str) -> bool:
    """Whether two mount points are the same, or one is inside the other."""
    return a == b or a.startswith(b + "/") or b.startswith(a + "/")


def parse_volumes(raw: object) -> tuple[VolumeRequest, ...]:
    if not isinstance(raw, list) or len(raw) > MAX_VOLUMES:
        raise FieldError("volumes", f"must be a list of at most {MAX_VOLUMES} {{name, path, readOnly}}")
    out: list[VolumeRequest] = []
    for i, item in enumerate(raw):
        at = f"volumes[{i}]"
        v = obj(item, at)
        no_extra(v, {"name", "path", "readOnly"}, at + ".")
        name_problem = snapshot_name_problem(v.get("name"))
        if name_problem is not None:
            raise FieldError(f"{at}.name", name_problem)
        name = str(v["name"])
        problem = volume_path_problem(v.get("path"))
        if problem is not None:
            raise FieldError(f"{at}.path", problem)
        path = str(v["path"])
        read_only = v.get("readOnly", False)
        if not isinstance(read_only, bool):
            raise FieldError(f"{at}.readOnly", "must be true or false")
        for j, other in enumerate(out):
            if other.name == name:
                raise FieldError(f"{at}.name", f"is volumes[{j}] already; attach a volume once")
            if paths_overlap(path, other.path):
                raise FieldError(f"{at}.path", f"overlaps volumes[{j}].path ({other.path})")
        out.append(VolumeRequest(name, path, read_only))
    return tuple(out)

SNAPSHOT_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
SNAPSHOT_NAME_RULE = ("1-64 characters of letters, digits, '.', '_' and '-', starting with a letter "
                      "or digit (no '/', '..' or NUL)")


def snapshot_name_problem(name: object) -> str | None:
    """Why ``name`` is not a snapshot name (issue 29), or None."""
    if not isinstance(name, str) or not name:
        return f"is required: {SNAPSHOT_NAME_RULE}"
    if len(name.encode("utf-8", "surrogatepass")) > 64:
        return f"is over 64 bytes; {SNAPSHOT_NAME_RULE}"
    if not SNAPSHOT_NAME_RE.fullmatch(name) or ".." in name:
        return f"must be {SNAPSHOT_NAME_RULE}"
    return None


def snapshot_name(params: dict[str, Any], name: str) -> str:
    problem = snapshot_name_problem(params.get(name))
    if problem is not None:
        raise FieldError(name, problem)
    return str(params[name])


def parse_open(raw: object, built: frozenset[Surface] = BUILT_SURFACES) -> OpenParams:
    params = obj(raw)
    no_extra(params, OPEN_FIELDS)
    workspace = string(params, "workspace", max_len=128)
    surface_raw = params.get("surface")
    surfaces = ", ".join(s.value for s in Surface)
    if not isinstance(surface_raw, str) or surface_raw not in Surface.__members__.values():
        raise FieldError("surface", f"must be one of {surfaces}")
    surface = Surface(surface_raw)
    if surface not in built:
        names = ", ".join(sorted(built))
        raise FieldError("surface", f"{surface} rigs are not available in this build yet; available: {names}")
    conversation = ident(params, "conversation", required=False)
    limits = LIMITS[surface]

    engine: Engine | None = None
    if params.get("engine") is not None:
        if surface is not Surface.BROWSER:
            raise FieldError("engine", f"only browser rigs take an engine, not {surface}")
        value = params["engine"]
        if not isinstance(value, str) or value not in Engine.__members__.values():
            raise FieldError("engine", f"unknown engine; one of {', '.join(e.value for e in Engine)}")
        engine = Engine(value)
        if engine not in BUILT_ENGINES:
            built_names = ", ".join(sorted(e.value for e in BUILT_ENGINES))
            raise FieldError("engine", f"the {engine} engine is not available in this build yet; "
                                       f"available: {built_names}")
    elif surface is Surface.BROWSER:
        engine = DEFAULT_ENGINE

    backends = SURFACE_BACKENDS[surface]
    backend = backends[0]
    if params.get("backend") is not None:
        value = params["backend"]
        names = ", ".join(b.value for b in backends)
        if not isinstance(value, str) or value not in [b.value for b in backends]:
            raise FieldError("backend", f"a {surface} rig runs on {names}")
        backend = Backend(value)

    display: Display | None = limits.display
    if params.get("display") is not None:
        if limits.display_max is None:
            raise FieldError("display", f"a {surface} rig has no display")
        d = obj(params["display"], "display")
        no_extra(d, {"width", "height"}, "display.")
        mx = limits.display_max
        width = integer(d, "width", 320, mx.width, -1)
        height = integer(d, "height", 240, mx.height, -1)
        if width < 0 or height < 0:
            raise FieldError("display", f"must have width and height, at most {mx.width}x{mx.height}")
        display = Display(width, height)

    memory_mb = integer(params, "memoryMb", limits.memory_mb_min, limits.memory_mb_max,
                        ENGINE_MEMORY_MB[engine] if engine is not None else limits.memory_mb, "MB")
    vcpus = integer(params, "vcpus", limits.vcpus_min, limits.vcpus_max, limits.vcpus)
    ttl_s = integer(params, "ttlS", limits.ttl_s_min, limits.ttl_s_max, limits.ttl_s, "seconds")
    idle_s = integer(params, "idleS", limits.idle_s_min, limits.idle_s_max, limits.idle_s, "seconds")

    allow: tuple[str, ...] = ()
    defaults = True
    if params.get("egress") is not None:
        eg = obj(params["egress"], "egress")
        no_extra(eg, {"allow", "defaults"}, "egress.")
        defaults = boolean(eg, "defaults", True)
        raw_allow = eg.get("allow", [])
        if not isinstance(raw_allow, list) or not all(isinstance(h, str) for h in raw_allow):
            raise FieldError("egress.allow", "must be a list of host names")
        allow = tuple(raw_allow)
    profile = None
    if params.get("profile") is not None:
        if surface is not Surface.BROWSER:
            raise FieldError("profile", f"only browser rigs take a profile, not {surface}")
        profile = parse_profile_name(params["profile"])
    snapshot = None
    if params.get("snapshot") is not None:
        if surface not in (Surface.TERMINAL, Surface.COMPUTER):
            raise FieldError("snapshot", f"only terminal and computer rigs open from a snapshot, "
                                         f"not {surface}")
        snapshot = snapshot_name(params, "snapshot")
    volumes: tuple[VolumeRequest, ...] = ()
    if params.get("volumes") is not None:
        volumes = parse_volumes(params["volumes"])
        if snapshot is not None and volumes:
            raise FieldError("volumes", "a rig resumed from a snapshot takes no volumes")
    seat = None
    if params.get("seat") is not None:
        seat = seat_name(params, "seat")
        if snapshot is not None:
            raise FieldError("seat", "a seat's rig is its own lasting machine, never one resumed from "
                                     "a snapshot; open the snapshot without a seat")
        if profile is not None:
            raise FieldError("profile", f"a seat's browser keeps the seat's own profile ({seat!r}); "
                                        "open without a profile")
        for i, v in enumerate(volumes):
            if paths_overlap(v.path, SEAT_PATH):
                raise FieldError(f"volumes[{i}].path", f"overlaps {SEAT_PATH}, where the seat's own "
                                                       "volume is mounted")
    return OpenParams(
        profile=profile, snapshot=snapshot, volumes=volumes, seat=seat,
        workspace=workspace, surface=surface, conversation=conversation, engine=engine,
        backend=backend, display=display, memory_mb=memory_mb, vcpus=vcpus, ttl_s=ttl_s,
        idle_s=idle_s, egress_allow=allow, egress_defaults=defaults,
        wait=boolean(params, "wait", True), backend_named=params.get("backend") is not None,
    )


# -- the rig methods' parameters (API.md), parsed at the server edge ----------------


@dataclass(frozen=True, slots=True)
class RigRef:
    """``{rigId}``: rig.get, rig.close, rig.watch, rig.park, rig.retry."""

    rig_id: str


def parse_rig_ref(raw: object) -> RigRef:
    params = obj(raw)
    no_extra(params, {"rigId"})
    return RigRef(ident(params, "rigId"))


#: ``rig.fork``'s bound on copies (issue 29).
MAX_FORK_COUNT = 8


@dataclass(frozen=True, slots=True)
class ForkParams:
    """``rig.fork {rigId, count}``: ``count`` copies (1..8, default 1) of a running rig."""

    rig_id: str
    count: int


def parse_fork(raw: object) -> ForkParams:
    params = obj(raw)
    no_extra(params, {"rigId", "count"})
    return ForkParams(ident(params, "rigId"), integer(params, "count", 1, MAX_FORK_COUNT, 1))


@dataclass(frozen=True, slots=True)
class SnapshotRef:
    """``snapshot.create {rigId, name}`` (``rig_id``), ``snapshot.rm {workspace, name}``."""

    name: str
    rig_id: str | None = None
    workspace: str | None = None


def parse_snapshot_create(raw: object) -> SnapshotRef:
    params = obj(raw)
    no_extra(params, {"rigId", "name"})
    return SnapshotRef(snapshot_name(params, "name"), rig_id=ident(params, "rigId"))


def parse_snapshot_rm(raw: object) -> SnapshotRef:
    params = obj(raw)
    no_extra(params, {"workspace", "name"})
    return SnapshotRef(snapshot_name(params, "name"), workspace=string(params, "workspace", max_len=128))


@dataclass(frozen=True, slots=True)
class VolumeCreate:
    workspace: str
    name: str
    size_mb: int


#: The largest volume (its workspace's ``volumes.quotaMb`` bounds it further).
MAX_VOLUME_MB = 1024 * 1024


def parse_volume_create(raw: object) -> VolumeCreate:
    params = obj(raw)
    no_extra(params, {"workspace", "name", "sizeMb"})
    if params.get("sizeMb") is None:
        raise FieldError("sizeMb", f"is required: the volume's size, 16 to {MAX_VOLUME_MB} MB")
    return VolumeCreate(string(params, "workspace", max_len=128), snapshot_name(params, "name"),
                        integer(params, "sizeMb", 16, MAX_VOLUME_MB, 0, "MB"))


@dataclass(frozen=True, slots=True)
class SeatParams:
    """``seat.acquire {workspace, name, conversation}``, ``seat.release`` (conversation
    optional: an admin or the holder), ``seat.handOver {workspace, name, to}`` (a person's
    user id; omitted: the caller), ``seat.handBack`` and ``seat.rm {workspace, name}``."""

    workspace: str
    name: str
    conversation: str | None = None
    to: str | None = None


def parse_seat_ref(raw: object) -> SeatParams:
    params = obj(raw)
    no_extra(params, {"workspace", "name"})
    return SeatParams(string(params, "workspace", max_len=128), seat_name(params))


def parse_seat_acquire(raw: object) -> SeatParams:
    params = obj(raw)
    no_extra(params, {"workspace", "name", "conversation"})
    return SeatParams(string(params, "workspace", max_len=128), seat_name(params),
                      conversation=ident(params, "conversation"))


def parse_seat_release(raw: object) -> SeatParams:
    params = obj(raw)
    no_extra(params, {"workspace", "name", "conversation"})
    return SeatParams(string(params, "workspace", max_len=128), seat_name(params),
                      conversation=ident(params, "conversation", required=False))


def parse_seat_hand_over(raw: object) -> SeatParams:
    params = obj(raw)
    no_extra(params, {"workspace", "name", "to"})
    return SeatParams(string(params, "workspace", max_len=128), seat_name(params),
                      to=ident(params, "to", required=False))


@dataclass(frozen=True, slots=True)
class ListParams:
    workspace: str
    include_closed: bool


def parse_workspace_ref(raw: object) -> ListParams:
    """``{workspace}`` (snapshot.list)."""
    params = obj(raw)
    no_extra(params, {"workspace"})
    return ListParams(string(params, "workspace", max_len=128), False)


def parse_list(raw: object) -> ListParams:
    params = obj(raw)
    no_extra(params, {"workspace", "includeClosed"})
    return ListParams(string(params, "workspace", max_len=128), boolean(params, "includeClosed", False))


@dataclass(frozen=True, slots=True)
class ActParams:
    """``rig.act``: the tool and action stay raw here, because the audit row records
    even a malformed call, and an action is parsed against the rig's display."""

    rig_id: str
    tool: object
    action: object


def parse_act(raw: object) -> ActParams:
    params = obj(raw)
    no_extra(params, {"rigId", "tool", "action"})
    return ActParams(ident(params, "rigId"), params.get("tool"), params.get("action"))


@dataclass(frozen=True, slots=True)
class EgressParams:
    rig_id: str
    allow: tuple[str, ...]
    defaults: bool


def parse_egress(raw: object) -> EgressParams:
    params = obj(raw)
    no_extra(params, {"rigId", "allow", "defaults"})
    rig_id = ident(params, "rigId")
    allow = params.get("allow", [])
    if not isinstance(allow, list) or not all(isinstance(h, str) for h in allow):
        raise FieldError("allow", "must be a list of host names")
    return EgressParams(rig_id, tuple(allow), boolean(params, "defaults", True))


def port_number(params: dict[str, Any], name: str) -> int:
    """A required TCP port, 1-65535 (a field error naming ``name`` otherwise)."""
    value = params.get(name)
    if value is None:
        raise FieldError(name, "is required (a port number, 1-65535)")
    if not isinstance(value, int) or isinstance(value, bool):
        raise FieldError(name, f"must be an integer port number, 1-65535 (not {type(value).__name__})")
    return integer(params, name, 1, 65535, 0)


@dataclass(frozen=True, slots=True)
class PortShareParams:
    """``rig.port.share {rigId, guestPort, lan}``."""

    rig_id: str
    guest_port: int
    lan: bool


def parse_port_share(raw: object) -> PortShareParams:
    params = obj(raw)
    no_extra(params, {"rigId", "guestPort", "lan"})
    if not isinstance(params.get("lan"), bool):
        raise FieldError("lan", "is required: true shares the port on the local network, false stops")
    return PortShareParams(ident(params, "rigId"), port_number(params, "guestPort"),
                           boolean(params, "lan", False))


@dataclass(frozen=True, slots=True)
class DomainParams:
    """``rig.domain.set {rigId, name, guestPort}`` and ``rig.domain.unset {rigId, name}`` (port 0)."""

    rig_id: str
    name: str
    guest_port: int


def _dev_name(params: dict[str, Any]) -> str:
    name = params.get("name")
    problem = dev_name_problem(name)
    if problem is not None:
        raise FieldError("name", problem)
    assert isinstance(name, str)
    return name


def parse_domain_set(raw: object) -> DomainParams:
    params = obj(raw)
    no_extra(params, {"rigId", "name", "guestPort"})
    return DomainParams(ident(params, "rigId"), _dev_name(params), port_number(params, "guestPort"))


def parse_domain_unset(raw: object) -> DomainParams:
    params = obj(raw)
    no_extra(params, {"rigId", "name"})
    return DomainParams(ident(params, "rigId"), _dev_name(params), 0)


@dataclass(frozen=True, slots=True)
class ControlParams:
    rig_id: str
    op: Literal["take", "release"]


def parse_control(raw: object) -> ControlParams:
    params = obj(raw)
    no_extra(params, {"rigId", "op"})
    rig_id = ident(params, "rigId")
    op = params.get("op")
    if op == "take":
        return ControlParams(rig_id, "take")
    if op == "release":
        return ControlParams(rig_id, "release")
    raise FieldError("op", "must be 'take' or 'release'")


#: ``rig.log``'s page size: the default and the most one call returns.
LOG_LIMIT_DEFAULT = 1000
LOG_LIMIT_MAX = 1000
#: Sequence numbers are at most this (JavaScript's Number.MAX_SAFE_INTEGER, which a page may
#: pass as ``beforeSeq`` for the newest page).
SEQ_MAX = 2**53 - 1


@dataclass(frozen=True, slots=True)
class LogParams:
    rig_id: str
    after_seq: int
    #: When set: the newest rows before this seq (and after ``after_seq``), newest first.
    before_seq: int | None = None
    limit: int = LOG_LIMIT_DEFAULT


def parse_log(raw: object) -> LogParams:
    params = obj(raw)
    no_extra(params, {"rigId", "afterSeq", "beforeSeq", "limit"})
    rig_id = ident(params, "rigId")
    after = params.get("afterSeq", 0)
    if not isinstance(after, int) or isinstance(after, bool) or not 0 <= after <= SEQ_MAX:
        raise FieldError("afterSeq", "must be a non-negative integer")
    before = params.get("beforeSeq")
    if before is not None and (not isinstance(before, int) or isinstance(before, bool)
                               or not 1 <= before <= SEQ_MAX):
        raise FieldError("beforeSeq", f"must be an integer 1..{SEQ_MAX} (the seq a page ends before)")
    limit = integer(params, "limit", 1, LOG_LIMIT_MAX, LOG_LIMIT_DEFAULT, "rows")
    return LogParams(rig_id, after, before, limit)


@dataclass(frozen=True, slots=True)
class EventsParams:
    workspace: str
    after_id: int


def parse_events(raw: object) -> EventsParams:
    params = obj(raw)
    no_extra(params, {"workspace", "afterId"})
    return EventsParams(string(params, "workspace", max_len=128), integer(params, "afterId", 0, 2**62, 0))


@dataclass(frozen=True, slots=True)
class ConversationParams:
    workspace: str
    conversation: str


def parse_conversation(raw: object) -> ConversationParams:
    params = obj(raw)
    no_extra(params, {"workspace", "conversation"})
    return ConversationParams(string(params, "workspace", max_len=128), ident(params, "conversation"))
