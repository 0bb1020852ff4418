"""Pools: rigs booted before anyone asks (issue 28) — the pure half.

A pool is a number of rigs of one shape (a :class:`PoolKey`: ``terminal``, ``computer``,
``browser:chromium|firefox|webkit``) kept booted, engine started, ready and owned by no
one. ``rig.open`` takes one when the request fits the pooled shape (:func:`pool_miss` says
why not), hands it to the caller (owner, workspace, allowlist, profile, display) and the
pool refills in the background. Every pooled rig boots on its own — a cold boot or the
shape's standby snapshot, never a running engine's memory — so no two rigs share an
engine's random state (docs/decisions.md, "No warm starts from a running engine").

Compute, then act (as :mod:`rigd.rigs.scheduler`): :func:`plan_pools` takes the pool sizes
and a snapshot of the pooled rigs and returns fills and retirements; the manager's pool
service (:mod:`rigd.rigs.pool_service`) carries them out. Parsing of the setting
(``server.configure {pools}``, ``rigd serve --pool KEY=N``) lives here too, so a bad value
is a field error naming the setting before anything changes.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from rigd.errors import FieldError
from rigd.model import ENGINE_MEMORY_MB, LIMITS, Engine, Phase, Surface

#: The most rigs one pool may hold.
MAX_POOL_SIZE = 8
#: A pooled rig older than this is replaced (``poolMaxAgeS``): an engine that has sat for
#: long has stale caches and timers; a fresh one costs only background CPU.
DEFAULT_MAX_AGE_S = 30 * 60
MAX_AGE_RANGE_S = (60, 24 * 3600)
#: Rigs being filled at once, over every pool: on a small host one background boot at a time
#: leaves the other cores to the rigs people are using.
FILLS_AT_ONCE = 1
#: After a pooled rig fails to come up, its pool waits this long before the next try, doubling
#: up to the cap (a pool whose image cannot be built does not burn the host retrying).
RETRY_FIRST_S = 30.0
RETRY_MAX_S = 600.0
#: What the default pools may take of the memory budget (a fresh laptop spares this much).
DEFAULT_SHARE = 4


@dataclass(frozen=True, slots=True, order=True)
class PoolKey:
    surface: Surface
    engine: Engine | None = None

    def __str__(self) -> str:
        return self.surface.value if self.engine is None else f"{self.surface.value}:{self.engine.value}"

    @property
    def memory_mb(self) -> int:
        """The memory of a rig of this shape (RIGS.md §7): what the budget counts for it."""
        if self.engine is not None:
            return ENGINE_MEMORY_MB[self.engine]
        return LIMITS[self.surface].memory_mb


POOL_KEYS: tuple[PoolKey, ...] = (
    PoolKey(Surface.TERMINAL),
    PoolKey(Surface.COMPUTER),
    PoolKey(Surface.BROWSER, Engine.CHROMIUM),
    PoolKey(Surface.BROWSER, Engine.FIREFOX),
    PoolKey(Surface.BROWSER, Engine.WEBKIT),
)
_BY_NAME = {str(k): k for k in POOL_KEYS}


def parse_pool_key(text: object, field: str) -> PoolKey:
    if not isinstance(text, str) or text not in _BY_NAME:
        raise FieldError(field, f"unknown pool; one of {', '.join(_BY_NAME)}")
    return _BY_NAME[text]


def _size(value: object, field: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_POOL_SIZE:
        raise FieldError(field, f"must be a whole number of rigs from 0 to {MAX_POOL_SIZE}")
    return value


def parse_pool_sizes(raw: object, field: str = "pools") -> dict[PoolKey, int]:
    """``{"browser:chromium": 1, "terminal": 2}`` → sizes; errors name ``pools.<key>``."""
    if not isinstance(raw, dict):
        raise FieldError(field, 'must be an object of pool sizes, e.g. {"browser:chromium": 1}')
    out: dict[PoolKey, int] = {}
    for name, value in raw.items():
        key = parse_pool_key(name, f"{field}.{str(name)[:40]}")
        out[key] = _size(value, f"{field}.{key}")
    return out


def parse_pool_flag(text: str) -> dict[PoolKey, int]:
    """One ``rigd serve --pool`` value: ``KEY=N`` (``browser:chromium=1``), or ``none``
    (every pool 0)."""
    if text.strip() == "none":
        return dict.fromkeys(POOL_KEYS, 0)
    name, sep, count = text.partition("=")
    if not sep or not count.strip().isdigit():
        raise FieldError("--pool", f"takes SURFACE[:ENGINE]=N or none (e.g. browser:chromium=1), "
                                   f"not {text!r}")
    key = parse_pool_key(name.strip(), "--pool")
    return {key: _size(int(count), f"--pool {key}")}


def pools_mb(sizes: Mapping[PoolKey, int]) -> int:
    return sum(k.memory_mb * n for k, n in sizes.items())


def check_fits(sizes: Mapping[PoolKey, int], budget_mb: int, field: str = "pools") -> None:
    """Pools that could never all be ready inside the memory budget are refused."""
    need = pools_mb(sizes)
    if need > budget_mb:
        shown = ", ".join(f"{k}={n}" for k, n in sorted(sizes.items()) if n)
        raise FieldError(field, f"pools of {shown} need {need} MB, more than the {budget_mb} MB memory "
                                "budget (raise memoryBudgetMb or make the pools smaller)")


def default_pools(budget_mb: int) -> dict[PoolKey, int]:
    """A terminal and a Chromium browser, each only while the defaults fit in a quarter of the
    budget (12 GB by default: both, 2.5 GB nominal; a parked-free terminal restores in
    well under a second anyway, the browser is where a pool saves tens of seconds)."""
    out = dict.fromkeys(POOL_KEYS, 0)
    left = budget_mb // DEFAULT_SHARE
    for key in (PoolKey(Surface.TERMINAL), PoolKey(Surface.BROWSER, Engine.CHROMIUM)):
        if key.memory_mb <= left:
            out[key] = 1
            left -= key.memory_mb
    return out


# -- what a pooled rig can serve -------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Request:
    """What of a ``rig.open`` decides whether a pooled rig can serve it."""

    surface: Surface
    engine: Engine | None
    memory_mb: int
    vcpus: int
    #: The caller named a backend that is not the one pooled rigs run on.
    other_backend: bool = False
    #: The workspace boots its own image for this surface (a custom image setting).
    custom_image: bool = False
    #: The workspace has credential-broker secrets (its rigs trust a broker CA at boot).
    brokered: bool = False


def key_of(surface: Surface, engine: Engine | None) -> PoolKey | None:
    key = PoolKey(surface, engine if surface is Surface.BROWSER else None)
    return key if key in _BY_NAME.values() else None


def pool_miss(req: Request, key: PoolKey) -> str | None:
    """Why a pooled rig of ``key`` cannot serve ``req`` (None: it can)."""
    limits = LIMITS[key.surface]
    if req.custom_image:
        return "the workspace boots its own image; pooled rigs run the built-in one"
    if req.other_backend:
        return "another backend was asked for than pooled rigs run on"
    if req.memory_mb != key.memory_mb:
        return f"{req.memory_mb} MB was asked for; pooled {key} rigs have {key.memory_mb} MB"
    if req.vcpus != limits.vcpus:
        return f"{req.vcpus} vCPUs were asked for; pooled {key} rigs have {limits.vcpus}"
    if req.brokered:
        return ("the workspace has brokered secrets, whose CA a rig trusts from its boot; "
                "pooled rigs carry none")
    return None


# -- the plan ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Member:
    """What the plan knows of one pooled rig."""

    rig_id: str
    key: PoolKey
    phase: Phase
    #: When it was started (the clock of ``now``).
    born: float


@dataclass(frozen=True, slots=True)
class Fill:
    key: PoolKey


@dataclass(frozen=True, slots=True)
class Retire:
    rig_id: str
    why: str


PoolAction = Fill | Retire


def plan_pools(
    sizes: Mapping[PoolKey, int], members: Sequence[Member], *, now: float, max_age_s: float,
    room_mb: int, retry_at: Mapping[PoolKey, float] | None = None,
    fills_at_once: int = FILLS_AT_ONCE,
) -> list[PoolAction]:
    """Fills and retirements due now.

    - A member past ``max_age_s`` no longer counts toward its pool's size; it is retired once
      enough young members are ready to stand in for it (so a pool never goes empty to renew).
    - A pool above its size (made smaller) retires its newest surplus, starting members first.
    - A pool below its size is filled, one rig at a time over every pool (``fills_at_once``),
      when the budget has room for the rig without evicting anything and its retry time
      (after a failure) has come. Pools are filled in :data:`POOL_KEYS` order.
    """
    retry_at = retry_at or {}
    out: list[PoolAction] = []
    filling = sum(1 for m in members if m.phase is Phase.PROVISIONING)
    by_key: dict[PoolKey, list[Member]] = {}
    for m in members:
        by_key.setdefault(m.key, []).append(m)
    for key in POOL_KEYS:
        size = sizes.get(key, 0)
        mine = by_key.get(key, [])
        old = [m for m in mine if now - m.born >= max_age_s and m.phase is Phase.READY]
        young = [m for m in mine if m not in old]
        young_ready = [m for m in young if m.phase is Phase.READY]
        if len(young) > size:
            # Newest first, and those still starting before those ready.
            surplus = sorted(young, key=lambda m: (m.phase is Phase.READY, -m.born))[: len(young) - size]
            out += [Retire(m.rig_id, f"the {key} pool holds {size}") for m in surplus]
            young = [m for m in young if m not in surplus]
            young_ready = [m for m in young_ready if m not in surplus]
        stand_ins = max(0, len(young_ready) - size + len(old))
        for m in sorted(old, key=lambda m: m.born)[: min(len(old), stand_ins) if size else len(old)]:
            out.append(Retire(m.rig_id, f"pooled for over {int(max_age_s)} s; replaced"))
        missing = size - len(young)
        while missing > 0 and filling < fills_at_once and now >= retry_at.get(key, 0.0):
            if key.memory_mb > room_mb:
                break
            out.append(Fill(key))
            room_mb -= key.memory_mb
            filling += 1
            missing -= 1
    return out


def next_retry(failures: int) -> float:
    """Seconds before a pool tries again after ``failures`` fills in a row failed."""
    return min(RETRY_MAX_S, RETRY_FIRST_S * float(2 ** max(0, failures - 1)))


def sizes_json(sizes: Mapping[PoolKey, int]) -> dict[str, int]:
    return {str(k): sizes.get(k, 0) for k in POOL_KEYS}


def merged(base: Mapping[PoolKey, int], changes: Iterable[Mapping[PoolKey, int]]) -> dict[PoolKey, int]:
    out = dict(base)
    for change in changes:
        out.update(change)
    return out


__all__ = [
    "DEFAULT_MAX_AGE_S", "MAX_POOL_SIZE", "POOL_KEYS", "Fill", "Member", "PoolAction", "PoolKey", "Request",
    "Retire", "check_fits", "default_pools", "key_of", "merged", "next_retry", "parse_pool_flag",
    "parse_pool_key", "parse_pool_sizes", "plan_pools", "pool_miss", "pools_mb", "sizes_json",
]
