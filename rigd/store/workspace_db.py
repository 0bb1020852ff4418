"""One SQLite database per workspace: ``rig_sessions`` and ``rig_action_log``
(RIGS.md §11), the workspace's events, and its guard decisions (``guard_log``).

The action log is written *before* a verb runs (outcome ``pending``) and
completed after, so an input is on record even if the server dies while it
runs. Sequence numbers come from ``rig_seq`` inside the same transaction as
the row, so they only grow — across restarts too — and never repeat.
Closed rigs keep their rows.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from rigd.errors import NotFound
from rigd.store.migrate import connect, migrate
from rigd.store.util import iso, utcnow

MIGRATIONS: list[str] = [
    # v1
    """
    CREATE TABLE rig_sessions (
        id TEXT PRIMARY KEY,
        workspace_id TEXT NOT NULL,
        conversation TEXT,
        surface TEXT NOT NULL,
        engine TEXT,
        backend TEXT NOT NULL,
        accel TEXT,
        phase TEXT NOT NULL,
        phase_detail TEXT NOT NULL DEFAULT '',
        close_reason TEXT,
        failure TEXT,
        display_w INTEGER,
        display_h INTEGER,
        memory_mb INTEGER NOT NULL,
        vcpus INTEGER NOT NULL,
        ttl_s INTEGER NOT NULL,
        idle_s INTEGER NOT NULL,
        image TEXT,
        exec_image INTEGER NOT NULL DEFAULT 0,
        created_by TEXT NOT NULL,
        controller_kind TEXT,
        controller_id TEXT,
        created_at TEXT NOT NULL,
        last_active_at TEXT NOT NULL,
        expires_at TEXT NOT NULL,
        closed_at TEXT,
        pid INTEGER,
        pid_start_ticks INTEGER,
        console_tail TEXT
    );
    CREATE INDEX rig_sessions_live ON rig_sessions(phase);
    CREATE INDEX rig_sessions_conversation ON rig_sessions(conversation, surface);
    CREATE TABLE rig_seq (
        rig_id TEXT PRIMARY KEY,
        last_seq INTEGER NOT NULL
    );
    CREATE TABLE rig_action_log (
        rig_id TEXT NOT NULL,
        seq INTEGER NOT NULL,
        at TEXT NOT NULL,
        actor_kind TEXT NOT NULL,
        actor_id TEXT NOT NULL,
        tool TEXT NOT NULL,
        verb TEXT NOT NULL,
        args TEXT NOT NULL,
        outcome TEXT NOT NULL,
        error TEXT,
        duration_ms INTEGER,
        PRIMARY KEY (rig_id, seq)
    );
    """,
    # v2: domain events (RigClosedEvent, RigControlChanged, RigReaped, phase changes)
    """
    CREATE TABLE rig_events (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        rig_id TEXT NOT NULL,
        at TEXT NOT NULL,
        type TEXT NOT NULL,
        data TEXT NOT NULL
    );
    CREATE INDEX rig_events_rig ON rig_events(rig_id, id);
    """,
    # v3: the rig's egress allowlist (JSON), as last set
    """
    ALTER TABLE rig_sessions ADD COLUMN egress TEXT;
    """,
    # v4: guard decisions (rigd.guard): every ask-first answer, time-out or read-only
    # refusal of a tool call, whether or not the call named a rig
    """
    CREATE TABLE guard_log (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        at TEXT NOT NULL,
        approval_id TEXT,
        decision TEXT NOT NULL
            CHECK (decision IN ('allowed', 'denied', 'timedOut', 'cancelled', 'readOnly')),
        tool TEXT NOT NULL,
        dialect TEXT NOT NULL,
        classes TEXT NOT NULL,
        args TEXT NOT NULL,
        rig_id TEXT,
        conversation TEXT NOT NULL,
        requested_by_kind TEXT NOT NULL,
        requested_by_id TEXT NOT NULL,
        requested_at TEXT NOT NULL,
        decided_by_kind TEXT,
        decided_by_id TEXT,
        waited_ms INTEGER NOT NULL
    );
    """,
    # v5: a terminal rig booted from a workspace's custom image (rigs.smolvm.execImage):
    # the registry reference it asked for, and why a stored setting was ignored
    """
    ALTER TABLE rig_sessions ADD COLUMN image_ref TEXT;
    ALTER TABLE rig_sessions ADD COLUMN image_note TEXT;
    """,
    # v6: how the rig came to be ('pool', 'warm' or 'cold'; issue 28), and why a pooled rig
    # could not serve its open
    """
    ALTER TABLE rig_sessions ADD COLUMN start TEXT;
    ALTER TABLE rig_sessions ADD COLUMN start_note TEXT;
    """,
    # v7: the rig this one is a fork of (rig.fork, issue 29)
    """
    ALTER TABLE rig_sessions ADD COLUMN forked_from TEXT;
    """,
    # v8: seats (issue 29): a named agent's one lasting rig, its volume and profile; which
    # conversation holds it, and the person it is handed to
    """
    ALTER TABLE rig_sessions ADD COLUMN seat TEXT;
    CREATE TABLE seats (
        name TEXT PRIMARY KEY,
        surface TEXT NOT NULL,
        engine TEXT,
        created_by TEXT NOT NULL,
        created_at TEXT NOT NULL,
        rig_id TEXT,
        holder TEXT,
        held_since TEXT,
        handed_to TEXT,
        handed_at TEXT
    );
    """,
    # v9: saved site logins (issue 30): the password sealed (AES-256-GCM, the key outside the
    # database: rigd.rigs.logins), never a column of its own in the clear
    """
    CREATE TABLE logins (
        site TEXT NOT NULL,
        account TEXT NOT NULL,
        sealed BLOB NOT NULL,
        created_by TEXT NOT NULL,
        created_at TEXT NOT NULL,
        PRIMARY KEY (site, account)
    );
    """,
]


@dataclass(slots=True)
class RigRow:
    """A row of ``rig_sessions``; field names follow the columns."""

    id: str
    workspace_id: str
    conversation: str | None
    surface: str
    engine: str | None
    backend: str
    accel: str | None
    phase: str
    phase_detail: str
    close_reason: str | None
    failure: str | None
    display_w: int | None
    display_h: int | None
    memory_mb: int
    vcpus: int
    ttl_s: int
    idle_s: int
    image: str | None
    exec_image: bool
    created_by: str
    controller_kind: str | None
    controller_id: str | None
    created_at: str
    last_active_at: str
    expires_at: str
    closed_at: str | None
    pid: int | None
    pid_start_ticks: int | None
    console_tail: str | None
    egress: str | None = None
    #: The registry reference of a custom image (pinned to its digest once pulled), or None.
    image_ref: str | None = None
    #: Why a workspace's custom-image setting was not used (the default booted), or None.
    image_note: str | None = None
    #: How the rig came to be: "pool" (taken from a pool), "warm" (a memory snapshot), "cold".
    start: str | None = None
    #: Why a pool could not serve this open (it opened warm or cold instead), or None.
    start_note: str | None = None
    #: The rig this one was forked from (``rig.fork``), or None.
    forked_from: str | None = None
    #: The seat this rig serves (``rig.open {seat}``), or None.
    seat: str | None = None


_RIG_COLUMNS = [f.name for f in fields(RigRow)]


@dataclass(slots=True)
class SeatRow:
    """A row of ``seats``: a named agent's lasting rig in its workspace (issue 29)."""

    name: str
    surface: str
    engine: str | None
    created_by: str
    created_at: str
    #: The seat's current (or last) rig, or None before its first open.
    rig_id: str | None = None
    #: The conversation holding the seat, and since when; None: free.
    holder: str | None = None
    held_since: str | None = None
    #: The person the seat is handed to (they drive it, agents only watch), and when.
    handed_to: str | None = None
    handed_at: str | None = None


_SEAT_COLUMNS = [f.name for f in fields(SeatRow)]


@dataclass(frozen=True, slots=True)
class ActionRow:
    rig_id: str
    seq: int
    at: str
    actor_kind: str
    actor_id: str
    tool: str
    verb: str
    args: dict[str, Any]
    outcome: str
    error: str | None
    duration_ms: int | None

    def to_json(self) -> dict[str, Any]:
        return {
            "rigId": self.rig_id, "seq": self.seq, "at": self.at,
            "actor": {"kind": self.actor_kind, "id": self.actor_id},
            "tool": self.tool, "verb": self.verb, "args": self.args,
            "outcome": self.outcome, "error": self.error, "durationMs": self.duration_ms,
        }


@dataclass(frozen=True, slots=True)
class GuardRow:
    """A row of ``guard_log``: one guard decision on one tool call."""

    id: int
    at: str
    #: None for a read-only refusal (nobody was asked).
    approval_id: str | None
    #: allowed, denied, timedOut, cancelled (the waiting call went away) or readOnly.
    decision: str
    tool: str
    dialect: str
    classes: tuple[str, ...]
    #: The call's arguments as the action log keeps them (rigd.verbs.audit: typed text masked).
    args: dict[str, Any]
    rig_id: str | None
    conversation: str
    requested_by_kind: str
    requested_by_id: str
    requested_at: str
    decided_by_kind: str | None
    decided_by_id: str | None
    waited_ms: int

    def to_json(self) -> dict[str, Any]:
        decided = ({"kind": self.decided_by_kind, "id": self.decided_by_id}
                   if self.decided_by_id is not None else None)
        return {
            "id": self.id, "at": self.at, "approvalId": self.approval_id, "decision": self.decision,
            "tool": self.tool, "dialect": self.dialect, "classes": list(self.classes), "args": self.args,
            "rigId": self.rig_id, "conversation": self.conversation,
            "requestedBy": {"kind": self.requested_by_kind, "id": self.requested_by_id},
            "requestedAt": self.requested_at, "decidedBy": decided, "waitedMs": self.waited_ms,
        }


LIVE_PHASES = ("provisioning", "ready", "parked", "closing")


class WorkspaceDB:
    def __init__(self, path: Path, workspace_id: str) -> None:
        self.path = path
        self.workspace_id = workspace_id
        self._conn = connect(str(path))
        self._lock = threading.Lock()
        migrate(self._conn, MIGRATIONS, kind="workspace")

    def close(self) -> None:
        with self._lock:
            self._conn.close()

    # -- rig_sessions --------------------------------------------------------

    def insert_rig(self, row: RigRow) -> None:
        values = [getattr(row, c) for c in _RIG_COLUMNS]
        marks = ", ".join("?" for _ in _RIG_COLUMNS)
        with self._lock:
            self._conn.execute(
                f"INSERT INTO rig_sessions ({', '.join(_RIG_COLUMNS)}) VALUES ({marks})",  # noqa: S608 - column names are ours
                values,
            )

    def update_rig(self, rig_id: str, **changes: Any) -> None:
        unknown = set(changes) - set(_RIG_COLUMNS)
        if unknown:
            raise ValueError(f"unknown rig_sessions columns: {sorted(unknown)}")
        if not changes:
            return
        assignments = ", ".join(f"{name} = ?" for name in changes)
        with self._lock:
            self._conn.execute(
                f"UPDATE rig_sessions SET {assignments} WHERE id = ?",  # noqa: S608 - column names checked above
                [*changes.values(), rig_id],
            )

    def get_rig(self, rig_id: str) -> RigRow:
        with self._lock:
            row = self._conn.execute("SELECT * FROM rig_sessions WHERE id = ?", (rig_id,)).fetchone()
        if row is None:
            raise NotFound(f"no rig {rig_id!r}", field="rigId")
        return _rig(row)

    def delete_rig(self, rig_id: str) -> None:
        """Forget a rig and its log (the pools' own database: a pooled rig handed over to a
        workspace, or retired, leaves nothing behind)."""
        with self._lock:
            for table in ("rig_action_log", "rig_seq", "rig_events", "rig_sessions"):
                column = "id" if table == "rig_sessions" else "rig_id"
                self._conn.execute(f"DELETE FROM {table} WHERE {column} = ?", (rig_id,))  # noqa: S608 - ours

    def list_rigs(self, *, include_closed: bool = True) -> list[RigRow]:
        """All rigs, or all but the closed ones (failed rigs stay listed for a retry)."""
        query = "SELECT * FROM rig_sessions"
        if not include_closed:
            query += " WHERE phase != 'closed'"
        with self._lock:
            rows = self._conn.execute(query + " ORDER BY created_at").fetchall()
        return [_rig(r) for r in rows]

    def live_rigs(self) -> list[RigRow]:
        """Rigs that may still have a machine (for crash recovery)."""
        with self._lock:
            rows = self._conn.execute(
                "SELECT * FROM rig_sessions WHERE phase IN (?, ?, ?, ?) ORDER BY created_at",
                LIVE_PHASES,
            ).fetchall()
        return [_rig(r) for r in rows]

    # -- seats (issue 29) ----------------------------------------------------

    def get_seat(self, name: str) -> SeatRow | None:
        with self._lock:
            row = self._conn.execute("SELECT * FROM seats WHERE name = ?", (name,)).fetchone()
        return None if row is None else SeatRow(**{c: row[c] for c in _SEAT_COLUMNS})

    def list_seats(self) -> list[SeatRow]:
        with self._lock:
            rows = self._conn.execute("SELECT * FROM seats ORDER BY name").fetchall()
        return [SeatRow(**{c: r[c] for c in _SEAT_COLUMNS}) for r in rows]

    def insert_seat(self, row: SeatRow) -> None:
        with self._lock:
            self._conn.execute(
                f"INSERT INTO seats ({', '.join(_SEAT_COLUMNS)}) "  # noqa: S608 - column names are ours
                f"VALUES ({', '.join('?' for _ in _SEAT_COLUMNS)})",
                [getattr(row, c) for c in _SEAT_COLUMNS],
            )

    def update_seat(self, name: str, **changes: Any) -> None:
        unknown = set(changes) - set(_SEAT_COLUMNS)
        if unknown or "name" in changes:
            raise ValueError(f"not seats columns to change: {sorted(unknown | ({'name'} & set(changes)))}")
        if changes:
            with self._lock:
                self._conn.execute(
                    f"UPDATE seats SET {', '.join(f'{c} = ?' for c in changes)} WHERE name = ?",  # noqa: S608 - checked above
                    [*changes.values(), name],
                )

    def delete_seat(self, name: str) -> None:
        with self._lock:
            self._conn.execute("DELETE FROM seats WHERE name = ?", (name,))

    # -- logins (issue 30) ---------------------------------------------------

    def put_login(self, site: str, account: str, sealed: bytes, created_by: str) -> None:
        """Save (or replace) a login's sealed password."""
        with self._lock:
            self._conn.execute(
                "INSERT INTO logins (site, account, sealed, created_by, created_at) VALUES (?, ?, ?, ?, ?) "
                "ON CONFLICT (site, account) DO UPDATE SET sealed = excluded.sealed, "
                "created_by = excluded.created_by, created_at = excluded.created_at",
                (site, account, sealed, created_by, iso(utcnow())),
            )

    def list_logins(self) -> list[tuple[str, str, str, str]]:
        """(site, account, created_by, created_at) of every saved login, never the password."""
        with self._lock:
            rows = self._conn.execute(
                "SELECT site, account, created_by, created_at FROM logins ORDER BY site, account").fetchall()
        return [(r[0], r[1], r[2], r[3]) for r in rows]

    def sealed_login(self, site: str, account: str) -> bytes | None:
        with self._lock:
            row = self._conn.execute("SELECT sealed FROM logins WHERE site = ? AND account = ?",
                                     (site, account)).fetchone()
        return None if row is None else bytes(row[0])

    def delete_login(self, site: str, account: str) -> bool:
        with self._lock:
            cur = self._conn.execute("DELETE FROM logins WHERE site = ? AND account = ?", (site, account))
        return cur.rowcount > 0

    # -- rig_events ---------------------------------------------------------

    def add_event(self, rig_id: str, type_: str, data: dict[str, Any]) -> tuple[int, str]:
        """Persist one event; returns its id (order of the workspace) and time."""
        at = iso(utcnow())
        encoded = json.dumps(data, separators=(",", ":"), sort_keys=True)
        with self._lock:
            cur = self._conn.execute(
                "INSERT INTO rig_events (rig_id, at, type, data) VALUES (?, ?, ?, ?)",
                (rig_id, at, type_, encoded),
            )
        return int(cur.lastrowid or 0), at

    def events(self, *, after_id: int = 0, limit: int = 1000) -> list[dict[str, Any]]:
        with self._lock:
            rows = self._conn.execute(
                "SELECT * FROM rig_events WHERE id > ? ORDER BY id LIMIT ?", (after_id, limit)
            ).fetchall()
        return [
            {"id": r["id"], "type": r["type"], "rigId": r["rig_id"], "at": r["at"],
             "workspace": self.workspace_id, **json.loads(r["data"])}
            for r in rows
        ]

    # -- guard_log ------------------------------------------------------------

    def add_guard_decision(self, row: GuardRow) -> int:
        """Persist one guard decision (``row.id`` is ignored); returns its id."""
        with self._lock:
            cur = self._conn.execute(
                "INSERT INTO guard_log (at, approval_id, decision, tool, dialect, classes, args, rig_id, "
                "conversation, requested_by_kind, requested_by_id, requested_at, decided_by_kind, "
                "decided_by_id, waited_ms) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (row.at, row.approval_id, row.decision, row.tool, row.dialect,
                 json.dumps(list(row.classes)), json.dumps(row.args, sort_keys=True, ensure_ascii=True),
                 row.rig_id, row.conversation, row.requested_by_kind, row.requested_by_id,
                 row.requested_at, row.decided_by_kind, row.decided_by_id, row.waited_ms),
            )
        return int(cur.lastrowid or 0)

    def guard_decisions(self, *, after_id: int = 0, limit: int = 1000) -> list[GuardRow]:
        with self._lock:
            rows = self._conn.execute(
                "SELECT * FROM guard_log WHERE id > ? ORDER BY id LIMIT ?", (after_id, limit)
            ).fetchall()
        return [
            GuardRow(r["id"], r["at"], r["approval_id"], r["decision"], r["tool"], r["dialect"],
                     tuple(json.loads(r["classes"])), json.loads(r["args"]), r["rig_id"], r["conversation"],
                     r["requested_by_kind"], r["requested_by_id"], r["requested_at"], r["decided_by_kind"],
                     r["decided_by_id"], r["waited_ms"])
            for r in rows
        ]

    # -- rig_action_log ------------------------------------------------------

    def begin_action(
        self, rig_id: str, *, actor_kind: str, actor_id: str, tool: str, verb: str,
        args: dict[str, Any],
    ) -> int:
        """Record an input before it runs; returns its sequence number."""
        encoded = json.dumps(args, separators=(",", ":"), sort_keys=True, ensure_ascii=True)
        with self._lock:
            conn = self._conn
            conn.execute("BEGIN IMMEDIATE")
            try:
                seq = int(
                    conn.execute(
                        "INSERT INTO rig_seq VALUES (?, 1) ON CONFLICT(rig_id) "
                        "DO UPDATE SET last_seq = last_seq + 1 RETURNING last_seq",
                        (rig_id,),
                    ).fetchone()[0]
                )
                conn.execute(
                    "INSERT INTO rig_action_log VALUES (?, ?, ?, ?, ?, ?, ?, ?, 'pending', NULL, NULL)",
                    (rig_id, seq, iso(utcnow()), actor_kind, actor_id, tool, verb, encoded),
                )
                conn.execute("COMMIT")
            except BaseException:
                conn.execute("ROLLBACK")
                raise
        return seq

    def finish_action(
        self, rig_id: str, seq: int, *, outcome: str, error: str | None, duration_ms: int
    ) -> None:
        with self._lock:
            self._conn.execute(
                "UPDATE rig_action_log SET outcome = ?, error = ?, duration_ms = ? "
                "WHERE rig_id = ? AND seq = ?",
                (outcome, error, duration_ms, rig_id, seq),
            )

    def abandon_pending(self) -> int:
        """Mark actions left ``pending`` by a crashed server as ``interrupted``."""
        with self._lock:
            cur = self._conn.execute(
                "UPDATE rig_action_log SET outcome = 'interrupted' WHERE outcome = 'pending'"
            )
        return int(cur.rowcount)

    def actions(self, rig_id: str, *, after_seq: int = 0, limit: int = 1000,
                before_seq: int | None = None) -> list[ActionRow]:
        """Rows after ``after_seq``, oldest first; with ``before_seq``, the newest rows
        before it (and after ``after_seq``), newest first. Seqs run 1, 2, 3… per rig."""
        with self._lock:
            if before_seq is None:
                rows = self._conn.execute(
                    "SELECT * FROM rig_action_log WHERE rig_id = ? AND seq > ? ORDER BY seq LIMIT ?",
                    (rig_id, after_seq, limit),
                ).fetchall()
            else:
                rows = self._conn.execute(
                    "SELECT * FROM rig_action_log WHERE rig_id = ? AND seq > ? AND seq < ? "
                    "ORDER BY seq DESC LIMIT ?",
                    (rig_id, after_seq, before_seq, limit),
                ).fetchall()
        return [
            ActionRow(
                r["rig_id"], r["seq"], r["at"], r["actor_kind"], r["actor_id"], r["tool"],
                r["verb"], json.loads(r["args"]), r["outcome"], r["error"], r["duration_ms"],
            )
            for r in rows
        ]


def _rig(row: Any) -> RigRow:
    values = {c: row[c] for c in _RIG_COLUMNS}
    values["exec_image"] = bool(values["exec_image"])
    return RigRow(**values)


def now_iso() -> str:
    return iso(utcnow())
