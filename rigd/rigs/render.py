"""How a rig and an exec look to callers (API.md "Rig"): pure functions over
the stored row and what the live rig knows."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from rigd.backends.base import ExecResult
from rigd.framing import untrusted_bytes
from rigd.model import Accel, CloseReason, Phase
from rigd.store.util import iso
from rigd.store.workspace_db import RigRow

if TYPE_CHECKING:
    from rigd.rigs.live import LiveRig

TCG_NOTE = (
    "running under TCG (software emulation): not a security boundary; "
    "for development and CI, not for hostile code"
)


def fork_note(parent: str, surface: str) -> str:
    """What a fork's copy says about itself (issue 29)."""
    if surface == "browser":
        return (f"forked from {parent}: a fresh engine with the parent's cookies, storage and open "
                "tab (a running engine is never shared)")
    return (f"forked from {parent}: processes that were running continue with the parent's memory, "
            "as after fork(2); machine-id, MAC and kernel RNG are this rig's own, and its disk "
            "writes are its own")


def iso_at(epoch: float) -> str:
    return iso(datetime.fromtimestamp(epoch, UTC))


def rig_json(row: RigRow, live: LiveRig | None, *, now: float, network: str | None,
             pins: Sequence[str] = ()) -> dict[str, Any]:
    """The Rig object: the stored row, plus what a live rig's machine reports
    (channel counters, resident memory, network) and its pins and lease."""
    display = None
    if row.display_w is not None and row.display_h is not None:
        display = {"width": row.display_w, "height": row.display_h}
    controller = None
    if row.controller_kind and row.controller_id:
        controller = {"kind": row.controller_kind, "id": row.controller_id}
    notes: list[str] = []
    if row.accel == Accel.TCG.value:
        notes.append(TCG_NOTE)
    if row.image_note:
        notes.append(row.image_note)
    if row.start_note:
        notes.append(row.start_note)
    if row.forked_from:
        notes.append(fork_note(row.forked_from, row.surface))
    out: dict[str, Any] = {
        "id": row.id, "workspace": row.workspace_id, "conversation": row.conversation,
        "surface": row.surface, "engine": row.engine, "backend": row.backend,
        "accel": row.accel, "phase": row.phase, "phaseDetail": row.phase_detail,
        "closeReason": row.close_reason, "failure": row.failure, "display": display,
        "controller": controller, "memoryMb": row.memory_mb, "vcpus": row.vcpus,
        "createdAt": row.created_at, "lastActiveAt": row.last_active_at,
        "expiresAt": row.expires_at, "closedAt": row.closed_at, "image": row.image,
        "imageRef": row.image_ref, "start": row.start, "forkedFrom": row.forked_from, "seat": row.seat,
        "execImage": row.exec_image, "securityBoundary": row.accel != Accel.TCG.value,
        "pid": row.pid if row.phase != Phase.CLOSED.value else None,
        "notes": notes,
    }
    if live is not None and live.profile is not None:
        out["profile"] = live.profile
    out["volumes"] = ([{"name": v.name, "path": v.path, "readOnly": v.read_only} for v in live.volumes]
                      if live is not None else [])
    if live is not None and live.info:
        out.update(live.info)
    if live is not None and live.machine is not None:
        out["agentChannel"] = live.machine.channel_stats()
        out["residentMb"] = live.machine.resident_mb()
        out["network"] = live.machine.network_info()
    elif row.egress:
        out["network"] = {"mode": network or "gateway", **json.loads(row.egress)}
    else:
        out["network"] = {"mode": "none"}
    if live is not None:
        out["pins"] = list(pins)
        if live.watched_until is not None and live.watched_until > now:
            out["watchedUntil"] = iso_at(live.watched_until)
        if controller is not None and live.lease_until is not None:
            # (a seat handed to a person: theirs until they hand it back)
            until = iso_at(live.lease_until) if math.isfinite(live.lease_until) else None
            out["controller"] = {**controller, "until": until}
    if row.phase == Phase.FAILED.value or (row.close_reason == CloseReason.BACKEND_FAILURE.value
                                            and row.console_tail):
        out["consoleTail"] = (row.console_tail or "")[-2048:]
    return out


def exec_json(result: ExecResult, limit: int) -> dict[str, Any]:
    out: dict[str, Any] = {
        "exitCode": result.exit_code,
        "signal": result.signal,
        "timedOut": result.timed_out,
        "durationMs": result.duration_ms,
        "stdout": untrusted_bytes(result.stdout, truncated=result.stdout_truncated, limit=limit),
        "stderr": untrusted_bytes(result.stderr, truncated=result.stderr_truncated, limit=limit),
    }
    if result.timed_out:
        out["note"] = "the command timed out; its whole process group was killed"
    return out
