"""Guard rules (RIGS.md §11): per-workspace settings admins write, and the
ask-first approvals an agent's tool call waits on.

How this works. Every rig tool declares action classes
(:data:`rigd.model.TOOL_ACTION_CLASSES`). Before ``tools.call`` runs a tool,
:meth:`Guard.admit` reads the workspace's rules and :func:`verdict` (pure)
answers *allow*, *read-only* (refuse: ``guard.readOnly`` denies every tool
that declares a class) or *ask* (some declared class is in
``guard.askFirst``). To ask, the call registers a :class:`Pending` approval in
memory, publishes ``ApprovalRequested`` and waits — at most the caller's
``approvalTimeoutS`` — for ``approval.decide``. Whoever settles an approval
first (a person's answer, the time-out, or the waiting call going away)
marks it synchronously, so exactly one outcome wins; that outcome is written
to the workspace's ``guard_log`` (and the named rig's action log) *before*
the tool runs. Pending approvals live only as long as the waiting call;
decisions are durable.

Who may answer: a *person* (``kind: person``) who is a member of the
approval's workspace and is not the user who made the call. Agent tokens
never answer, and the token that asked cannot approve itself. An approval of
a workspace the caller is not in answers like a missing one.

Settings are a typed registry (:data:`SETTINGS`): each key has one parser that
turns a JSON value into a typed value or raises a :class:`FieldError` naming
``value``; a new key (issue 14's ``rigs.smolvm.execImage``) is one more
:class:`Setting` in the table.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import trio

from rigd.errors import Conflict, FieldError, Forbidden, NotFound
from rigd.images.registry import parse_reference
from rigd.model import TOOL_ACTION_CLASSES, ActionClass
from rigd.rigs.events import APPROVAL_DECIDED, APPROVAL_REQUESTED, EventBus
from rigd.rigs.live import Caller
from rigd.rigs.params import ID_RE, boolean, ident, integer, no_extra, obj, string
from rigd.store.aio import Stores
from rigd.store.server_db import User, Workspace
from rigd.store.util import iso, new_id, utcnow
from rigd.store.workspace_db import GuardRow
from rigd.verbs import audit_args

log = logging.getLogger("rigd.guard")

#: How long a call that needs approval waits by default, and the bounds of
#: ``approvalTimeoutS`` (seconds). Five minutes lets a person notice; an hour
#: matches the longest exec.
APPROVAL_TIMEOUT_DEFAULT_S = 300.0
APPROVAL_TIMEOUT_MIN_S = 0.1
APPROVAL_TIMEOUT_MAX_S = 3600.0
#: Approvals that may wait at once in one workspace; past it a call is refused
#: at once (each holds a request open, and a person reads the list).
PENDING_MAX = 64


# --- workspace settings: a typed registry ------------------------------------------------


@dataclass(frozen=True, slots=True)
class Setting:
    key: str
    #: The value a workspace has until an admin sets one (as JSON).
    default: Any
    #: JSON value → the stored (normalised) JSON value; raises FieldError("value", …).
    parse: Callable[[object], Any]
    doc: str


def _bool(value: object) -> bool:
    if not isinstance(value, bool):
        raise FieldError("value", "must be true or false")
    return value


_CLASSES = tuple(c.value for c in ActionClass)


def _classes(value: object) -> list[str]:
    if not isinstance(value, list) or len(value) > 2 * len(_CLASSES):
        raise FieldError("value", f"must be a list of action classes (of {', '.join(_CLASSES)})")
    out: set[str] = set()
    for i, item in enumerate(value):
        if not isinstance(item, str) or item not in _CLASSES:
            shown = item[:40] if isinstance(item, str) else type(item).__name__
            raise FieldError("value", f"item {i} ({shown!r}) is not an action class; one of "
                                      f"{', '.join(_CLASSES)}")
        out.add(item)
    return [c for c in _CLASSES if c in out]  # one order, whatever order was given


def _image(value: object) -> str:
    """A registry reference, normalised (``ubuntu:24.04`` → ``docker.io/library/ubuntu:24.04``);
    local paths, archives, transports and flag-like strings are refused."""
    return str(parse_reference(value, "value"))


def _megabytes(value: object) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= SNAPSHOT_QUOTA_MAX_MB:
        raise FieldError("value", f"must be an integer between 0 and {SNAPSHOT_QUOTA_MAX_MB} (MB)")
    return value


#: What a workspace's named snapshots may hold on the host (issue 29), by default and at most.
SNAPSHOT_QUOTA = "snapshots.quotaMb"
SNAPSHOT_QUOTA_DEFAULT_MB = 20 * 1024
SNAPSHOT_QUOTA_MAX_MB = 16 * 1024 * 1024

#: What a workspace's volumes may add up to (issue 29), by default (a volume is sparse: the
#: host pays for what the guest writes, up to this).
VOLUME_QUOTA = "volumes.quotaMb"
VOLUME_QUOTA_DEFAULT_MB = 50 * 1024

#: The custom-image keys (RIGS.md §3, "Custom images per workspace").
EXEC_IMAGE = "rigs.smolvm.execImage"
BROWSER_IMAGE = "rigs.smolvm.browserImage"

SETTINGS: dict[str, Setting] = {s.key: s for s in (
    Setting("guard.readOnly", False, _bool,
            "deny every tool that declares an action class (rig_list still answers)"),
    Setting("guard.askFirst", [], _classes,
            "action classes whose tool calls wait for a person's approval"),
    Setting(EXEC_IMAGE, None, _image,
            "the registry image this workspace's terminal rigs boot (null: the built-in image)"),
    Setting(BROWSER_IMAGE, None, _image,
            "the registry image this workspace's Chromium rigs boot (null: the built-in image)"),
    Setting(SNAPSHOT_QUOTA, SNAPSHOT_QUOTA_DEFAULT_MB, _megabytes,
            "the host disk this workspace's named snapshots may use, in MB (RAM and disk of each)"),
    Setting(VOLUME_QUOTA, VOLUME_QUOTA_DEFAULT_MB, _megabytes,
            "what the sizes of this workspace's volumes may add up to, in MB"),
)}


def parse_setting(key: object, value: object) -> tuple[Setting, Any]:
    """A key and its value (``None``: back to the default) as stored; FieldErrors name
    ``key`` or ``value``."""
    if not isinstance(key, str) or key not in SETTINGS:
        raise FieldError("key", f"unknown setting; one of {', '.join(sorted(SETTINGS))}")
    setting = SETTINGS[key]
    return setting, None if value is None else setting.parse(value)


@dataclass(frozen=True, slots=True)
class Rules:
    """A workspace's guard rules, typed."""

    read_only: bool = False
    ask_first: frozenset[ActionClass] = frozenset()


@dataclass(frozen=True, slots=True)
class WorkspaceSettings:
    #: Every key's value in force (defaults included), as JSON.
    values: Mapping[str, Any]
    #: key → (updatedAt, updatedBy) of the keys an admin set.
    changed: Mapping[str, tuple[str, str]]
    #: key → why its stored value is not in force (the default holds meanwhile).
    ignored: Mapping[str, str] = field(default_factory=dict)

    @property
    def rules(self) -> Rules:
        return Rules(bool(self.values["guard.readOnly"]),
                     frozenset(ActionClass(c) for c in self.values["guard.askFirst"]))

    def to_json(self, workspace: Workspace) -> dict[str, Any]:
        return {"workspace": workspace.id, "settings": dict(self.values),
                "changed": {k: {"at": at, "by": by} for k, (at, by) in self.changed.items()},
                "ignored": dict(self.ignored)}


def custom_image(settings: WorkspaceSettings, surface: str,
                 engine: str | None) -> tuple[str | None, str | None]:
    """The registry reference a new rig of ``surface`` boots by the workspace's settings, and
    a note for the Rig when a setting is not used (the built-in image boots then): a stored
    value that is not a registry reference (checked again here, at boot), or a browser key
    that does not apply (Firefox and WebKit rigs boot their own images)."""
    key = EXEC_IMAGE if surface == "terminal" else BROWSER_IMAGE if surface == "browser" else None
    if key is None:
        return None, None
    if key in settings.ignored:
        return None, f"{key}: {settings.ignored[key]}; the built-in image boots"
    value = settings.values.get(key)
    if value is None:
        return None, None
    try:
        ref = str(parse_reference(value, key))
    except FieldError as exc:
        return None, f"{key}: {exc.reason}; the built-in image boots"
    if key == BROWSER_IMAGE and engine not in (None, "chromium"):
        return None, f"{key} ({ref}) applies to Chromium rigs only; this {engine} rig boots its own image"
    return ref, None


# --- the decision (pure) ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Verdict:
    #: "allow", "readOnly" or "ask".
    kind: str
    #: The declared classes that made it so (for "ask": those in askFirst).
    classes: tuple[ActionClass, ...] = ()


def verdict(rules: Rules, classes: tuple[ActionClass, ...]) -> Verdict:
    """What the rules say of a tool declaring ``classes``: read-only wins over ask-first;
    a tool that declares nothing (rig_list) is always allowed."""
    if not classes:
        return Verdict("allow")
    if rules.read_only:
        return Verdict("readOnly", classes)
    asked = tuple(c for c in classes if c in rules.ask_first)
    return Verdict("ask", asked) if asked else Verdict("allow")


def approval_timeout(params: Mapping[str, Any]) -> float:
    """``approvalTimeoutS`` of a tools.call (seconds), or the default."""
    value = params.get("approvalTimeoutS")
    if value is None:
        return APPROVAL_TIMEOUT_DEFAULT_S
    if (not isinstance(value, int | float) or isinstance(value, bool) or not math.isfinite(value)
            or not APPROVAL_TIMEOUT_MIN_S <= value <= APPROVAL_TIMEOUT_MAX_S):
        raise FieldError("approvalTimeoutS", f"must be a number of seconds between {APPROVAL_TIMEOUT_MIN_S} "
                                             f"and {APPROVAL_TIMEOUT_MAX_S:g}")
    return float(value)


# --- requests, approvals, tickets ---------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Request:
    """One tool call as the guard sees it."""

    workspace: str
    conversation: str
    #: The name the caller used (a vendor's ``computer`` too), the rigd tool behind it.
    name: str
    tool: str
    dialect: str
    arguments: Mapping[str, Any]
    #: The rig the call names (as given: checked here), if any.
    rig: object = None

    @property
    def classes(self) -> tuple[ActionClass, ...]:
        return TOOL_ACTION_CLASSES.get(self.tool, ())

    @property
    def rig_id(self) -> str | None:
        return self.rig if isinstance(self.rig, str) and ID_RE.match(self.rig) else None


def _who(user: User) -> dict[str, Any]:
    return {"id": user.id, "name": user.name, "kind": user.kind}


@dataclass(slots=True)
class Pending:
    id: str
    workspace_id: str
    request: Request
    #: The rig the call named, when it is one of this workspace's.
    rig_id: str | None
    classes: tuple[ActionClass, ...]
    args: dict[str, Any]
    requested_by: User
    requested_at: str
    expires_at: str
    started: float
    #: Set once the outcome is on record (the waiter then goes on).
    settled: trio.Event = field(default_factory=trio.Event)
    decision: str | None = None
    decided_by: User | None = None

    def settle(self, decision: str, by: User | None) -> bool:
        """Take the outcome; False when another settled it first (no await in between)."""
        if self.decision is not None:
            return False
        self.decision, self.decided_by = decision, by
        return True

    def to_json(self) -> dict[str, Any]:
        return {
            "approvalId": self.id, "workspace": self.workspace_id,
            "conversation": self.request.conversation, "tool": self.request.name,
            "rigdTool": self.request.tool, "dialect": self.request.dialect,
            "classes": [c.value for c in self.classes], "args": self.args, "rigId": self.rig_id,
            "requestedBy": _who(self.requested_by), "requestedAt": self.requested_at,
            "expiresAt": self.expires_at,
        }


@dataclass(frozen=True, slots=True)
class Ticket:
    """What the guard let through: nothing to add (no approval was needed), an approval
    to state in the result, or a refusal to return instead of running the tool."""

    refusal: dict[str, Any] | None = None
    approval: dict[str, Any] | None = None

    def stamp(self, result: dict[str, Any]) -> dict[str, Any]:
        """The tool's result, saying who approved the call (for the model and the caller)."""
        if self.approval is None:
            return result
        by = self.approval["decidedBy"]
        note = {"type": "text", "text": f"(This call was approved by {by['name']}, a person, under the "
                                        "workspace's ask-first rule; approval "
                                        f"{self.approval['approvalId']}.)"}
        content = result.get("content")
        return {**result, "content": [*content, note] if isinstance(content, list) else [note],
                "approval": self.approval}


def _refusal(text: str, **extra: Any) -> dict[str, Any]:
    return {"content": [{"type": "text", "text": text}], "isError": True, **extra}


# --- the service --------------------------------------------------------------------------


class Guard:
    """Workspace settings, the approvals waiting now, and the guard log."""

    def __init__(self, stores: Stores, events: EventBus) -> None:
        self.stores = stores
        self.events = events
        self._settings: dict[str, WorkspaceSettings] = {}
        self._pending: dict[str, Pending] = {}

    # -- settings -------------------------------------------------------------------------

    async def _workspace(self, caller: Caller, ref: str, *, admin: bool = False) -> Workspace:
        """A workspace of the caller's; admins (``admin=True``) reach any workspace."""
        server = self.stores.server
        try:
            return await self.stores.run(server.resolve_workspace, caller.user.id, ref)
        except NotFound:
            if admin and caller.user.is_admin:
                return await self.stores.run(server.get_workspace, ref)
            raise

    async def settings(self, workspace_id: str) -> WorkspaceSettings:
        cached = self._settings.get(workspace_id)
        if cached is not None:
            return cached
        rows = await self.stores.run(self.stores.server.workspace_settings, workspace_id)
        values = {k: s.default for k, s in SETTINGS.items()}
        changed: dict[str, tuple[str, str]] = {}
        ignored: dict[str, str] = {}
        for row in rows:
            setting = SETTINGS.get(row.key)
            try:
                if setting is None:
                    raise FieldError("key", "unknown to this rigd")
                values[row.key] = setting.parse(json.loads(row.value))
            except (ValueError, FieldError) as exc:
                # Written by another rigd version, or planted in the store: its default holds
                # until an admin sets it again, and whoever reads the settings is told so.
                reason = exc.reason if isinstance(exc, FieldError) else f"not JSON: {exc}"
                log.warning("ignoring a stored workspace setting",
                            extra={"workspace": workspace_id, "key": row.key[:64], "reason": reason})
                if setting is not None:
                    ignored[row.key] = f"the stored value {row.value[:120]!s} is ignored: {reason}"
                continue
            changed[row.key] = (row.updated_at, row.updated_by)
        settings = WorkspaceSettings(values, changed, ignored)
        self._settings[workspace_id] = settings
        return settings

    async def get_settings(self, caller: Caller, raw: object) -> dict[str, Any]:
        """``workspace.settings.get {workspace}``: members and admins."""
        params = obj(raw)
        no_extra(params, {"workspace"})
        ws = await self._workspace(caller, string(params, "workspace", max_len=128), admin=True)
        return (await self.settings(ws.id)).to_json(ws)

    async def set_setting(self, caller: Caller, raw: object) -> dict[str, Any]:
        """``workspace.settings.set {workspace, key, value}`` (admins; ``value: null`` resets)."""
        params = obj(raw)
        no_extra(params, {"workspace", "key", "value"})
        ref = string(params, "workspace", max_len=128)
        if not caller.user.is_admin:  # the RPC table says so too; the guard does not rely on it
            raise Forbidden("workspace.settings.set is for admins only")
        if "value" not in params:
            raise FieldError("value", "is required (null puts the key back to its default)")
        setting, value = parse_setting(params.get("key"), params["value"])
        ws = await self._workspace(caller, ref, admin=True)
        encoded = None if value is None else json.dumps(value)
        await self.stores.run(self.stores.server.set_workspace_setting, ws.id, setting.key, encoded,
                              caller.user.id)
        self._settings.pop(ws.id, None)
        log.info("workspace setting", extra={"workspace": ws.id, "key": setting.key, "by": caller.user.id})
        current = await self.settings(ws.id)
        return {"workspace": ws.id, "key": setting.key, "value": current.values[setting.key]}

    # -- the hook in tools.call ------------------------------------------------------------

    async def admit(self, caller: Caller, request: Request, timeout_s: float) -> Ticket:
        """Whether ``request`` may run: at once, after a person's approval, or not at all."""
        if not request.classes:
            return Ticket()
        ws = await self._workspace(caller, request.workspace)
        decided = verdict((await self.settings(ws.id)).rules, request.classes)
        if decided.kind == "allow":
            return Ticket()
        rig_id = await self._own_rig(ws.id, request.rig_id)
        # As rig.act's log keeps them; the rig a call names is stated beside them, checked.
        args = audit_args(request.tool, {k: v for k, v in request.arguments.items() if k != "rigId"})
        classes = ", ".join(c.value for c in decided.classes)
        if decided.kind == "readOnly":
            now = iso(utcnow())
            await self._record(ws.id, GuardRow(
                0, now, None, "readOnly", request.name, request.dialect,
                tuple(c.value for c in decided.classes), args, rig_id, request.conversation,
                caller.actor_kind, caller.actor_id, now, None, None, 0))
            return Ticket(refusal=_refusal(
                f"error: workspace {ws.name!r} is read-only (guard.readOnly): {request.name} declares "
                f"{classes} and is refused. Tools that declare no action class (rig_list) still answer; "
                "an admin can lift read-only mode with workspace.settings.set.",
                error_data={"field": "name", "reason": "the workspace is read-only", "guard": "readOnly"}))
        if sum(1 for p in self._pending.values() if p.workspace_id == ws.id) >= PENDING_MAX:
            return Ticket(refusal=_refusal(
                f"error: {PENDING_MAX} calls of this workspace already wait for a person's approval; "
                "wait for them to be answered before asking again",
                error_data={"field": "name", "reason": "too many approvals waiting"}))
        return await self._ask(caller, ws, request, rig_id, decided.classes, args, timeout_s)

    async def _own_rig(self, ws_id: str, rig_id: str | None) -> str | None:
        """The named rig, if it is one of this workspace's (a stranger's is not echoed)."""
        if rig_id is None:
            return None
        owner = await self.stores.run(self.stores.server.workspace_of_rig, rig_id)
        return rig_id if owner == ws_id else None

    async def _ask(self, caller: Caller, ws: Workspace, request: Request, rig_id: str | None,
                   classes: tuple[ActionClass, ...], args: dict[str, Any], timeout_s: float) -> Ticket:
        expires = datetime.fromtimestamp(time.time() + timeout_s, UTC)
        pending = Pending(new_id("apr"), ws.id, request, rig_id, classes, args, caller.user,
                          iso(utcnow()), iso(expires), trio.current_time())
        self._pending[pending.id] = pending
        try:
            # The event's own rigId and workspace say those; the rest is approval.list's row.
            shown = {k: v for k, v in pending.to_json().items() if k not in ("workspace", "rigId")}
            await self.events.publish(ws.id, rig_id or "", APPROVAL_REQUESTED, **shown)
            with trio.move_on_after(timeout_s):
                await pending.settled.wait()
            if pending.settle("timedOut", None):
                await self._finish(pending)
            else:
                await pending.settled.wait()  # an answer is being written; it is short
        except BaseException:
            if pending.settle("cancelled", None):
                with trio.CancelScope(shield=True):
                    await self._finish(pending)
            raise
        finally:
            self._pending.pop(pending.id, None)
        by = pending.decided_by
        stated = {"approvalId": pending.id, "decision": pending.decision,
                  "decidedBy": _who(by) if by is not None else None}
        if pending.decision == "allowed":
            return Ticket(approval=stated)
        if pending.decision == "denied":
            assert by is not None
            text = (f"error: {by.name} (a person) denied this {request.name} call (approval {pending.id}; "
                    f"the workspace asks first for {', '.join(c.value for c in classes)}). Do not repeat it "
                    "unchanged; ask the person or take another way.")
        else:
            text = (f"error: nobody answered approval {pending.id} within {timeout_s:g} s, so this "
                    f"{request.name} call did not run (the workspace asks a person first for "
                    f"{', '.join(c.value for c in classes)}). It may be asked again later.")
        reason = f"approval {pending.decision}"
        return Ticket(refusal=_refusal(text, approval=stated, error_data={"field": "name", "reason": reason}))

    async def _finish(self, pending: Pending) -> None:
        """Put a settled approval on record, tell watchers, then let the waiting call go on."""
        try:
            with trio.CancelScope(shield=True):
                assert pending.decision is not None
                by = pending.decided_by
                await self._record(pending.workspace_id, GuardRow(
                    0, iso(utcnow()), pending.id, pending.decision, pending.request.name,
                    pending.request.dialect, tuple(c.value for c in pending.classes), pending.args,
                    pending.rig_id, pending.request.conversation, pending.requested_by.kind,
                    pending.requested_by.id, pending.requested_at, by.kind if by else None,
                    by.id if by else None, int((trio.current_time() - pending.started) * 1000)),
                    by=by)
                await self.events.publish(pending.workspace_id, pending.rig_id or "", APPROVAL_DECIDED,
                                          approvalId=pending.id, decision=pending.decision,
                                          decidedBy=_who(by) if by is not None else None)
        finally:
            pending.settled.set()

    async def _record(self, ws_id: str, row: GuardRow, by: User | None = None) -> None:
        """The decision in the workspace's guard log and, when the call named one of its
        rigs, in that rig's action log (actor: who decided, else who called)."""
        with trio.CancelScope(shield=True):
            db = await self.stores.workspace(ws_id)
            await self.stores.run(db.add_guard_decision, row)
            if row.rig_id is not None:
                kind, actor = (by.kind, by.id) if by is not None else (row.requested_by_kind,
                                                                        row.requested_by_id)
                entry = {"approvalId": row.approval_id, "tool": row.tool, "classes": list(row.classes)}
                seq = await self.stores.run(db.begin_action, row.rig_id, actor_kind=kind, actor_id=actor,
                                            tool="guard", verb=row.decision, args=entry)
                await self.stores.run(db.finish_action, row.rig_id, seq,
                                      outcome="ok" if row.decision == "allowed" else "refused",
                                      error=None, duration_ms=row.waited_ms)
        log.info("guard decision", extra={"workspace": ws_id, "decision": row.decision, "tool": row.tool,
                                          "approval": row.approval_id})

    # -- approvals ----------------------------------------------------------------------------

    async def list_approvals(self, caller: Caller, raw: object) -> list[dict[str, Any]]:
        """``approval.list {workspace}``: the calls of a workspace waiting now, oldest first."""
        params = obj(raw)
        no_extra(params, {"workspace"})
        ws = await self._workspace(caller, string(params, "workspace", max_len=128))
        return [p.to_json() for p in sorted(self._pending.values(), key=lambda p: p.started)
                if p.workspace_id == ws.id and p.decision is None]

    async def decide(self, caller: Caller, raw: object) -> dict[str, Any]:
        """``approval.decide {approvalId, allow}``: a person of the workspace answers."""
        params = obj(raw)
        no_extra(params, {"approvalId", "allow"})
        approval_id = ident(params, "approvalId")
        if "allow" not in params:
            raise FieldError("allow", "is required: true or false")
        allow = boolean(params, "allow", False)
        missing = NotFound(f"no approval {approval_id!r} is waiting", field="approvalId")
        pending = self._pending.get(approval_id)
        if pending is None:
            raise missing
        if not await self.stores.run(self.stores.server.is_member, pending.workspace_id, caller.user.id):
            raise missing
        if caller.user.kind != "person":
            raise Forbidden("approvals are a person's to answer; agent tokens cannot")
        if caller.user.id == pending.requested_by.id:
            raise Forbidden("the user who made the call cannot approve it; another person must")
        if not pending.settle("allowed" if allow else "denied", caller.user):
            raise Conflict(f"approval {approval_id} was settled already ({pending.decision})",
                           field="approvalId", decision=pending.decision)
        await self._finish(pending)
        return {"approvalId": pending.id, "decision": pending.decision, "decidedBy": _who(caller.user)}

    async def guard_log(self, caller: Caller, raw: object) -> list[dict[str, Any]]:
        """``guard.log {workspace, afterId?, limit?}``: the workspace's guard decisions, oldest first."""
        params = obj(raw)
        no_extra(params, {"workspace", "afterId", "limit"})
        ws = await self._workspace(caller, string(params, "workspace", max_len=128))
        after = integer(params, "afterId", 0, 1 << 62, 0)
        limit = integer(params, "limit", 1, 1000, 1000)
        db = await self.stores.workspace(ws.id)
        return [r.to_json() for r in await self.stores.run(db.guard_decisions, after_id=after, limit=limit)]
