"""The rig manager: opens, drives, watches and closes rigs.

Each live rig is owned by one task in the manager's nursery. That task enters
the backend's ``open_machine`` context (boot), marks the rig ``ready``, and
then waits for one of two things: the machine dying on its own (the rig
becomes ``failed`` with ``backendFailure``), or a close, which cancels the
task so the backend tears the machine down in a shielded scope. Phase changes
go through :func:`rigd.lifecycle.check_transition` and are written to the
workspace database as they happen.

Visibility: every method resolves the rig through the caller's memberships;
a rig of a workspace the caller is not in answers exactly like a missing rig.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import trio

from rigd import lifecycle
from rigd.backends.base import ExecResult, Machine, MachineBackend, MachineSpec
from rigd.backends.procs import proc_alive
from rigd.errors import BackendError, Conflict, FieldError, NotFound, RigdError
from rigd.framing import untrusted_bytes
from rigd.model import TOOL_SURFACES, Accel, CloseReason, Phase, Surface, Tool
from rigd.params import ident, no_extra, obj, parse_open, string
from rigd.store.aio import Stores
from rigd.store.server_db import User
from rigd.store.util import iso, new_id, utcnow
from rigd.store.workspace_db import RigRow, WorkspaceDB
from rigd.verbs import ParseContext, TerminalExec, audit_args, parse_action

log = logging.getLogger("rigd.rigs")

#: Output kept per stream of an ``exec`` answered over RPC.
EXEC_OUTPUT_LIMIT = 2 * 1024 * 1024

TCG_NOTE = (
    "running under TCG (software emulation): not a security boundary; "
    "for development and CI, not for hostile code"
)


@dataclass(frozen=True, slots=True)
class Caller:
    user: User

    @property
    def actor_kind(self) -> str:
        return self.user.kind

    @property
    def actor_id(self) -> str:
        return self.user.id


@dataclass(slots=True)
class LiveRig:
    row: RigRow
    db: WorkspaceDB
    machine: Machine | None = None
    scope: trio.CancelScope | None = None
    settled: trio.Event = field(default_factory=trio.Event)
    finished: trio.Event = field(default_factory=trio.Event)
    close_lock: trio.Lock = field(default_factory=trio.Lock)
    terminals: int = 0
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def phase(self) -> Phase:
        return Phase(self.row.phase)


class RigManager:
    def __init__(
        self,
        stores: Stores,
        backends: dict[Surface, MachineBackend],
        *,
        accel: Accel | None,
        accel_problem: str | None = None,
    ) -> None:
        self.stores = stores
        self.backends = backends
        self.accel = accel
        self.accel_problem = accel_problem
        self.live: dict[str, LiveRig] = {}
        self._nursery: trio.Nursery | None = None
        self._open_locks: dict[tuple[str, str], trio.Lock] = {}

    # -- service lifetime -------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        await self.recover()
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                task_status.started()
                try:
                    await trio.sleep_forever()
                finally:
                    # However the service ends, no machine outlives it.
                    await self.shutdown()
        finally:
            self._nursery = None

    async def shutdown(self) -> None:
        """Close every live rig with ``serverShutdown`` (used on SIGINT/SIGTERM)."""
        with trio.CancelScope(shield=True):
            async with trio.open_nursery() as nursery:
                for rig in list(self.live.values()):
                    nursery.start_soon(self._close, rig, CloseReason.SERVER_SHUTDOWN, None)

    async def recover(self) -> None:
        """Settle rigs a previous server left live (it crashed or was killed).

        A surviving QEMU is identified by pid *and* start time, so a recycled
        pid is never killed. Survivors close with ``serverShutdown``; rigs whose
        QEMU had already died close with ``backendFailure``.
        """
        data_dir = self.stores.data_dir
        for ws in await self.stores.run(self.stores.server.all_workspaces):
            db = await self.stores.workspace(ws.id)
            await self.stores.run(db.abandon_pending)
            for row in await self.stores.run(db.live_rigs):
                alive = row.pid is not None and proc_alive(row.pid, row.pid_start_ticks)
                if alive and row.pid is not None:
                    await _kill_pid(row.pid, row.pid_start_ticks)
                reason = CloseReason.SERVER_SHUTDOWN if alive else CloseReason.BACKEND_FAILURE
                await trio.to_thread.run_sync(_remove_runtime, data_dir, row.id)
                await self.stores.run(
                    db.update_rig, row.id, phase=Phase.CLOSED.value,
                    phase_detail="closed after a server restart",
                    close_reason=row.close_reason or reason.value, closed_at=iso(utcnow()),
                )
                log.info("recovered rig", extra={"rig": row.id, "reason": reason.value})

    # -- visibility -------------------------------------------------------------

    async def _workspace_for(self, caller: Caller, ref: str) -> str:
        ws = await self.stores.run(self.stores.server.resolve_workspace, caller.user.id, ref)
        return ws.id

    async def _visible(self, caller: Caller, rig_id: str) -> tuple[RigRow, WorkspaceDB, LiveRig | None]:
        missing = NotFound(f"no rig {rig_id!r}", field="rigId")
        ws_id = await self.stores.run(self.stores.server.workspace_of_rig, rig_id)
        if ws_id is None:
            raise missing
        member = await self.stores.run(self.stores.server.is_member, ws_id, caller.user.id)
        if not member:
            raise missing
        live = self.live.get(rig_id)
        if live is not None:
            return live.row, live.db, live
        db = await self.stores.workspace(ws_id)
        return await self.stores.run(db.get_rig, rig_id), db, None

    # -- Rig JSON -----------------------------------------------------------------

    def rig_json(self, row: RigRow, live: LiveRig | None = None) -> dict[str, Any]:
        display = None
        if row.display_w is not None and row.display_h is not None:
            display = {"width": row.display_w, "height": row.display_h}
        controller = None
        if row.controller_kind and row.controller_id:
            controller = {"kind": row.controller_kind, "id": row.controller_id}
        notes: list[str] = []
        if row.accel == Accel.TCG.value:
            notes.append(TCG_NOTE)
        out: dict[str, Any] = {
            "id": row.id, "workspace": row.workspace_id, "conversation": row.conversation,
            "surface": row.surface, "engine": row.engine, "backend": row.backend,
            "accel": row.accel, "phase": row.phase, "phaseDetail": row.phase_detail,
            "closeReason": row.close_reason, "failure": row.failure, "display": display,
            "controller": controller, "memoryMb": row.memory_mb, "vcpus": row.vcpus,
            "createdAt": row.created_at, "lastActiveAt": row.last_active_at,
            "expiresAt": row.expires_at, "closedAt": row.closed_at, "image": row.image,
            "execImage": row.exec_image, "securityBoundary": row.accel != Accel.TCG.value,
            "pid": row.pid if row.phase != Phase.CLOSED.value else None,
            "notes": notes,
        }
        if live is not None and live.info:
            out.update(live.info)
        if live is not None and live.machine is not None:
            out["agentChannel"] = live.machine.channel_stats()
        return out

    # -- open -----------------------------------------------------------------------

    async def open(self, caller: Caller, raw: object) -> dict[str, Any]:
        params = parse_open(raw)
        ws_id = await self._workspace_for(caller, params.workspace)
        backend = self.backends.get(params.surface)
        if backend is None:
            raise FieldError("surface", f"{params.surface} rigs are not available on this server")
        if self.accel is None:
            raise RigdError(
                "this server has no working accelerator: "
                f"{self.accel_problem or 'none was found'}. Restart it with --accel tcg to use "
                "software emulation (not a security boundary)",
                field="accel",
            )
        db = await self.stores.workspace(ws_id)
        if params.conversation is not None and params.surface is Surface.TERMINAL:
            lock = self._open_locks.setdefault((ws_id, params.conversation), trio.Lock())
            async with lock:
                for rig in self.live.values():
                    r = rig.row
                    if (r.workspace_id == ws_id and r.conversation == params.conversation
                            and r.surface == Surface.TERMINAL.value and r.exec_image
                            and rig.phase in lifecycle.LIVE):
                        return await self._answer_open(rig, params.wait)
                rig = await self._start(caller, params, ws_id, db)
        else:
            rig = await self._start(caller, params, ws_id, db)
        return await self._answer_open(rig, params.wait)

    async def _answer_open(self, rig: LiveRig, wait: bool) -> dict[str, Any]:
        if wait:
            await rig.settled.wait()
        if rig.phase is Phase.FAILED:
            raise BackendError(
                f"rig {rig.row.id} failed to start: {rig.row.failure}", rig=self.rig_json(rig.row, rig)
            )
        return self.rig_json(rig.row, rig)

    async def _start(
        self, caller: Caller, params: Any, ws_id: str, db: WorkspaceDB
    ) -> LiveRig:
        assert self._nursery is not None, "RigManager.run is not running"
        now = utcnow()
        rig_id = new_id("rig")
        row = RigRow(
            id=rig_id, workspace_id=ws_id, conversation=params.conversation,
            surface=params.surface.value, engine=params.engine.value if params.engine else None,
            backend=params.backend.value, accel=self.accel.value if self.accel else None,
            phase=Phase.PROVISIONING.value, phase_detail="queued", close_reason=None, failure=None,
            display_w=params.display.width if params.display else None,
            display_h=params.display.height if params.display else None,
            memory_mb=params.memory_mb, vcpus=params.vcpus, ttl_s=params.ttl_s,
            idle_s=params.idle_s, image=None,
            exec_image=params.surface is Surface.TERMINAL, created_by=caller.user.id,
            controller_kind=None, controller_id=None, created_at=iso(now),
            last_active_at=iso(now), expires_at=iso(now + timedelta(seconds=params.ttl_s)),
            closed_at=None, pid=None, pid_start_ticks=None, console_tail=None,
        )
        await self.stores.run(db.insert_rig, row)
        await self.stores.run(self.stores.server.index_rig, rig_id, ws_id)
        rig = LiveRig(row=row, db=db)
        self.live[rig_id] = rig
        await self.audit_event(rig, caller, "open", {"surface": row.surface,
                                                          "memoryMb": row.memory_mb,
                                                          "vcpus": row.vcpus})
        await self._nursery.start(self._rig_task, rig, self.backends[params.surface])
        return rig

    async def _rig_task(
        self, rig: LiveRig, backend: MachineBackend, *, task_status: trio.TaskStatus[None]
    ) -> None:
        row = rig.row
        spec = MachineSpec(rig_id=row.id, surface=Surface(row.surface),
                           memory_mb=row.memory_mb, vcpus=row.vcpus)
        progress = self._progress_for(rig)
        try:
            with trio.CancelScope() as scope:
                rig.scope = scope
                task_status.started()
                try:
                    async with backend.open_machine(spec, progress) as machine:
                        rig.machine = machine
                        info = machine.info
                        rig.info = {"confinement": dict(info.confinement)}
                        await self._update(rig, pid=info.pid, pid_start_ticks=info.pid_start_ticks,
                                           image=info.image, accel=info.accel.value)
                        await self._transition(rig, Phase.READY, "ready")
                        rig.settled.set()
                        reason = await machine.wait_failed()
                        await self._fail(rig, reason, machine.console_tail())
                except RigdError as exc:
                    console = exc.data.get("console") if isinstance(exc.data.get("console"), str) else None
                    await self._fail(rig, exc.message, console)
                except OSError as exc:
                    await self._fail(rig, f"host error: {exc}", None)
        finally:
            rig.machine = None
            rig.settled.set()
            rig.finished.set()
            if rig.phase is Phase.FAILED:
                # Keep the row; the rig stays visible as failed until closed.
                pass

    def _progress_for(self, rig: LiveRig) -> Callable[[str], None]:
        def apply(detail: str) -> None:
            if rig.phase is Phase.PROVISIONING:
                rig.row.phase_detail = detail
                if self._nursery is not None:
                    self._nursery.start_soon(self._persist_detail, rig, detail)

        def progress(detail: str) -> None:
            try:
                trio.lowlevel.current_task()
            except RuntimeError:
                trio.from_thread.run_sync(apply, detail)
            else:
                apply(detail)

        return progress

    async def _persist_detail(self, rig: LiveRig, detail: str) -> None:
        if rig.row.phase_detail == detail:
            await self.stores.run(rig.db.update_rig, rig.row.id, phase_detail=detail)

    async def _update(self, rig: LiveRig, **changes: Any) -> None:
        for name, value in changes.items():
            setattr(rig.row, name, value)
        with trio.CancelScope(shield=True):
            await self.stores.run(rig.db.update_rig, rig.row.id, **changes)

    async def _transition(self, rig: LiveRig, target: Phase, detail: str, **changes: Any) -> None:
        lifecycle.check_transition(rig.phase, target)
        await self._update(rig, phase=target.value, phase_detail=detail, **changes)
        logging.getLogger(f"rigd.rig.{rig.row.id}").info(
            "phase", extra={"phase": target.value, "detail": detail}
        )

    async def _fail(self, rig: LiveRig, reason: str, console: str | None) -> None:
        if not lifecycle.can_transition(rig.phase, Phase.FAILED):
            return
        await self._transition(
            rig, Phase.FAILED, reason[:300], failure=reason[:2000],
            close_reason=CloseReason.BACKEND_FAILURE.value,
            console_tail=(console or "")[-4096:] or None,
        )
        rig.settled.set()

    # -- list / get / close -----------------------------------------------------------

    async def list_rigs(self, caller: Caller, raw: object) -> list[dict[str, Any]]:
        params = obj(raw)
        no_extra(params, {"workspace", "includeClosed"})
        ref = string(params, "workspace", max_len=128)
        assert ref is not None
        include_closed = params.get("includeClosed", False)
        if not isinstance(include_closed, bool):
            raise FieldError("includeClosed", "must be true or false")
        ws_id = await self._workspace_for(caller, ref)
        db = await self.stores.workspace(ws_id)
        rows = await self.stores.run(db.list_rigs, include_closed=include_closed)
        out = []
        for row in rows:
            live = self.live.get(row.id)
            out.append(self.rig_json(live.row if live else row, live))
        return out

    async def get(self, caller: Caller, raw: object) -> dict[str, Any]:
        params = obj(raw)
        no_extra(params, {"rigId"})
        rig_id = ident(params, "rigId")
        assert rig_id is not None
        row, _db, live = await self._visible(caller, rig_id)
        return self.rig_json(row, live)

    async def close(self, caller: Caller, raw: object) -> dict[str, Any]:
        params = obj(raw)
        no_extra(params, {"rigId"})
        rig_id = ident(params, "rigId")
        assert rig_id is not None
        row, db, live = await self._visible(caller, rig_id)
        if live is None:
            if row.phase == Phase.FAILED.value:
                # Failed before this server started: its machine is long gone.
                lifecycle.check_transition(Phase.FAILED, Phase.CLOSED)
                await self.stores.run(db.update_rig, rig_id, phase=Phase.CLOSED.value,
                                      phase_detail="closed", closed_at=iso(utcnow()))
                row = await self.stores.run(db.get_rig, rig_id)
            return self.rig_json(row)
        await self._close(live, CloseReason.REQUESTED, caller)
        return self.rig_json(live.row)

    async def _close(self, rig: LiveRig, reason: CloseReason, caller: Caller | None) -> None:
        with trio.CancelScope(shield=True):
            async with rig.close_lock:
                if rig.phase is Phase.CLOSED:
                    return
                if caller is not None:
                    await self.audit_event(rig, caller, "close", {"reason": reason.value})
                if rig.phase is not Phase.FAILED:
                    await self._transition(rig, Phase.CLOSING, "stopping the machine",
                                           close_reason=reason.value)
                if rig.scope is not None:
                    rig.scope.cancel()
                await rig.finished.wait()
                await self._transition(rig, Phase.CLOSED, "closed", closed_at=iso(utcnow()))
                self.live.pop(rig.row.id, None)

    # -- act ----------------------------------------------------------------------------

    async def act(self, caller: Caller, raw: object) -> dict[str, Any]:
        params = obj(raw)
        no_extra(params, {"rigId", "tool", "action"})
        rig_id = ident(params, "rigId")
        assert rig_id is not None
        row, db, live = await self._visible(caller, rig_id)
        tool_raw = params.get("tool")
        action = params.get("action")
        tools = ", ".join(t.value for t in Tool)
        tool_name = tool_raw if isinstance(tool_raw, str) and len(tool_raw) <= 64 else "?"
        args = audit_args(tool_name, action)
        verb = args.get("action") if isinstance(args.get("action"), str) else "?"
        started = time.monotonic()
        seq = await self.stores.run(
            db.begin_action, rig_id, actor_kind=caller.actor_kind, actor_id=caller.actor_id,
            tool=tool_name, verb=str(verb)[:64], args=args,
        )
        outcome, error = "error", None
        try:
            if tool_raw not in Tool.__members__.values():
                raise FieldError("tool", f"must be one of {tools}")
            tool = Tool(str(tool_raw))
            surface = Surface(row.surface)
            if surface not in TOOL_SURFACES[tool]:
                raise FieldError("tool", f"a {surface} rig does not answer {tool}")
            display = None
            if row.display_w and row.display_h:
                from rigd.model import Display
                display = Display(row.display_w, row.display_h)
            parsed = parse_action(tool.value, action, ParseContext(surface=surface, display=display))
            if isinstance(parsed, FieldError):
                raise parsed
            if live is None or live.machine is None or live.phase is not Phase.READY:
                outcome = "refused"
                lifecycle.require_phase(Phase(live.row.phase if live else row.phase),
                                        frozenset({Phase.READY}), f"run {tool}.{verb}")
            assert live is not None and live.machine is not None
            result = await self._execute(live, live.machine, parsed)
            outcome = "ok"
            await self._touch(live)
            return result
        except RigdError as exc:
            error = exc.message[:500]
            raise
        finally:
            with trio.CancelScope(shield=True):
                await self.stores.run(
                    db.finish_action, rig_id, seq, outcome=outcome, error=error,
                    duration_ms=int((time.monotonic() - started) * 1000),
                )

    async def _touch(self, rig: LiveRig) -> None:
        await self._update(rig, last_active_at=iso(utcnow()))

    async def _execute(self, rig: LiveRig, machine: Machine, action: object) -> dict[str, Any]:
        if isinstance(action, TerminalExec):
            result = await self.exec(machine, action, max_output=EXEC_OUTPUT_LIMIT)
            return exec_json(result, EXEC_OUTPUT_LIMIT)
        raise FieldError("action.action", f"{type(action).__name__} is not available in this build")

    async def exec(self, machine: Machine, action: TerminalExec, *, max_output: int) -> ExecResult:
        return await machine.exec(
            list(action.program), cwd=action.cwd, env=action.env_dict or None, stdin=action.stdin,
            timeout_s=action.timeout_s, max_output=max_output,
        )

    async def audit_event(
        self, rig: LiveRig, caller: Caller, verb: str, args: dict[str, Any]
    ) -> None:
        with trio.CancelScope(shield=True):
            seq = await self.stores.run(
                rig.db.begin_action, rig.row.id, actor_kind=caller.actor_kind,
                actor_id=caller.actor_id, tool="rig", verb=verb, args=args,
            )
            await self.stores.run(rig.db.finish_action, rig.row.id, seq, outcome="ok",
                                  error=None, duration_ms=0)

    # -- audit log ------------------------------------------------------------------------

    async def actions(self, caller: Caller, raw: object) -> list[dict[str, Any]]:
        params = obj(raw)
        no_extra(params, {"rigId", "afterSeq"})
        rig_id = ident(params, "rigId")
        assert rig_id is not None
        after = params.get("afterSeq", 0)
        if not isinstance(after, int) or isinstance(after, bool) or after < 0:
            raise FieldError("afterSeq", "must be a non-negative integer")
        _row, db, _live = await self._visible(caller, rig_id)
        rows = await self.stores.run(db.actions, rig_id, after_seq=after)
        return [r.to_json() for r in rows]

    # -- terminals (PTY) ----------------------------------------------------------------

    async def terminal_rig(self, caller: Caller, rig_id: str) -> LiveRig:
        _row, _db, live = await self._visible(caller, rig_id)
        if live is None or live.machine is None or live.phase is not Phase.READY:
            phase = live.row.phase if live else _row.phase
            raise Conflict(f"rig {rig_id} is {phase}; a terminal needs a ready rig")
        return live


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


def _remove_runtime(data_dir: Path, rig_id: str) -> None:
    shutil.rmtree(data_dir / "rigs" / "smolvm" / rig_id, ignore_errors=True)
    (data_dir / "rigs" / "run" / f"{rig_id}.qcow2").unlink(missing_ok=True)


async def _kill_pid(pid: int, ticks: int | None) -> None:
    for sig, wait_s in ((signal.SIGTERM, 3.0), (signal.SIGKILL, 5.0)):
        if not proc_alive(pid, ticks):
            return
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            return
        deadline = trio.current_time() + wait_s
        # Not our child (its parent was the crashed server): nothing to wait on but /proc.
        while trio.current_time() < deadline and proc_alive(pid, ticks):  # noqa: ASYNC110
            await trio.sleep(0.05)
