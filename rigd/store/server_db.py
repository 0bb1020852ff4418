"""The server database: users, bearer tokens, workspaces, memberships, and an
index from rig id to workspace (so ``rig.get`` by id finds the right
workspace database without scanning them all)."""

from __future__ import annotations

import sqlite3
import threading
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from rigd.errors import Conflict, FieldError, NotFound
from rigd.store.migrate import connect, migrate
from rigd.store.util import iso, new_id, new_token, token_hash, utcnow

MIGRATIONS: list[str] = [
    # v1
    """
    CREATE TABLE users (
        id TEXT PRIMARY KEY,
        name TEXT NOT NULL UNIQUE,
        kind TEXT NOT NULL CHECK (kind IN ('person', 'agent')),
        is_admin INTEGER NOT NULL DEFAULT 0,
        created_at TEXT NOT NULL
    );
    CREATE TABLE tokens (
        id TEXT PRIMARY KEY,
        user_id TEXT NOT NULL REFERENCES users(id),
        token_sha256 TEXT NOT NULL UNIQUE,
        label TEXT NOT NULL,
        created_at TEXT NOT NULL,
        revoked_at TEXT
    );
    CREATE TABLE workspaces (
        id TEXT PRIMARY KEY,
        name TEXT NOT NULL UNIQUE,
        created_at TEXT NOT NULL,
        deleted_at TEXT
    );
    CREATE TABLE memberships (
        workspace_id TEXT NOT NULL REFERENCES workspaces(id),
        user_id TEXT NOT NULL REFERENCES users(id),
        created_at TEXT NOT NULL,
        PRIMARY KEY (workspace_id, user_id)
    );
    CREATE TABLE rig_index (
        rig_id TEXT PRIMARY KEY,
        workspace_id TEXT NOT NULL REFERENCES workspaces(id)
    );
    """,
    # v2: clipboard access, per user and per direction (RIGS.md §10; never per workspace)
    """
    CREATE TABLE clipboard_policy (
        user_id TEXT PRIMARY KEY REFERENCES users(id),
        host_to_rig TEXT NOT NULL CHECK (host_to_rig IN ('allow', 'ask', 'deny')),
        rig_to_host TEXT NOT NULL CHECK (rig_to_host IN ('allow', 'ask', 'deny')),
        updated_at TEXT NOT NULL
    );
    CREATE TABLE clipboard_grants (
        user_id TEXT NOT NULL REFERENCES users(id),
        rig_id TEXT NOT NULL,
        until_epoch REAL NOT NULL,
        PRIMARY KEY (user_id, rig_id)
    );
    """,
    # v3: people's page sessions (a cookie; only its sha256 is kept)
    """
    CREATE TABLE sessions (
        id_sha256 TEXT PRIMARY KEY,
        user_id TEXT NOT NULL REFERENCES users(id),
        created_at TEXT NOT NULL,
        expires_epoch REAL NOT NULL
    );
    """,
    # v4: per-workspace settings written by admins (rigd.rigs.guard.SETTINGS: one typed key each,
    # the value as JSON); a key that is absent has its default
    """
    CREATE TABLE workspace_settings (
        workspace_id TEXT NOT NULL REFERENCES workspaces(id),
        key TEXT NOT NULL,
        value TEXT NOT NULL,
        updated_at TEXT NOT NULL,
        updated_by TEXT NOT NULL REFERENCES users(id),
        PRIMARY KEY (workspace_id, key)
    );
    """,
]

#: A person's clipboard choices before they make any: paste in is allowed,
#: copy out asks first.
DEFAULT_HOST_TO_RIG = "allow"
DEFAULT_RIG_TO_HOST = "ask"
CLIPBOARD_CHOICES = ("allow", "ask", "deny")

NAME_MAX = 64


@dataclass(frozen=True, slots=True)
class User:
    id: str
    name: str
    kind: str
    is_admin: bool

    def to_json(self) -> dict[str, object]:
        return {"id": self.id, "name": self.name, "kind": self.kind, "admin": self.is_admin}


@dataclass(frozen=True, slots=True)
class Workspace:
    id: str
    name: str
    created_at: str

    def to_json(self) -> dict[str, object]:
        return {"id": self.id, "name": self.name, "createdAt": self.created_at}


@dataclass(frozen=True, slots=True)
class Membership:
    workspace_id: str
    user_id: str


def _check_name(field: str, value: str) -> str:
    name = value.strip()
    if not name or len(name) > NAME_MAX or not name.isprintable():
        raise FieldError(field, f"must be 1 to {NAME_MAX} printable characters")
    return name


class ServerDB:
    """Synchronous access to ``server.db``. One instance per process; calls are
    serialised by a lock so the async adapter may use any worker thread."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._conn = connect(str(path))
        self._lock = threading.Lock()
        migrate(self._conn, MIGRATIONS, kind="server")

    def close(self) -> None:
        with self._lock:
            self._conn.close()

    # -- bootstrap ---------------------------------------------------------

    def bootstrap(self) -> tuple[User, Workspace, str | None]:
        """Ensure an admin and a ``default`` workspace exist.

        Returns the admin, the default workspace, and a fresh admin token when
        this call created the admin (``None`` on later starts: the token is
        stored only as a hash and cannot be shown again).
        """
        with self._lock:
            conn = self._conn
            conn.execute("BEGIN IMMEDIATE")
            try:
                row = conn.execute(
                    "SELECT * FROM users WHERE is_admin = 1 ORDER BY created_at LIMIT 1"
                ).fetchone()
                token: str | None = None
                if row is None:
                    admin = User(new_id("usr"), "admin", "person", True)
                    conn.execute(
                        "INSERT INTO users VALUES (?, ?, ?, 1, ?)",
                        (admin.id, admin.name, admin.kind, iso(utcnow())),
                    )
                    token = new_token()
                    conn.execute(
                        "INSERT INTO tokens VALUES (?, ?, ?, ?, ?, NULL)",
                        (new_id("tok"), admin.id, token_hash(token), "admin", iso(utcnow())),
                    )
                else:
                    admin = _user(row)
                ws_row = conn.execute(
                    "SELECT * FROM workspaces WHERE name = 'default'"
                ).fetchone()
                if ws_row is None:
                    ws = Workspace(new_id("ws"), "default", iso(utcnow()))
                    conn.execute(
                        "INSERT INTO workspaces VALUES (?, ?, ?, NULL)",
                        (ws.id, ws.name, ws.created_at),
                    )
                    conn.execute(
                        "INSERT INTO memberships VALUES (?, ?, ?)",
                        (ws.id, admin.id, iso(utcnow())),
                    )
                else:
                    ws = _workspace(ws_row)
                conn.execute("COMMIT")
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            return admin, ws, token

    # -- users and tokens --------------------------------------------------

    def user_for_token(self, token: str) -> User | None:
        with self._lock:
            row = self._conn.execute(
                "SELECT u.* FROM tokens t JOIN users u ON u.id = t.user_id "
                "WHERE t.token_sha256 = ? AND t.revoked_at IS NULL",
                (token_hash(token),),
            ).fetchone()
        return None if row is None else _user(row)

    def create_user(self, name: str, kind: str = "agent", *, admin: bool = False) -> User:
        name = _check_name("name", name)
        if kind not in ("person", "agent"):
            raise FieldError("kind", "must be 'person' or 'agent'")
        user = User(new_id("usr"), name, kind, admin)
        with self._lock:
            try:
                self._conn.execute(
                    "INSERT INTO users VALUES (?, ?, ?, ?, ?)",
                    (user.id, user.name, user.kind, int(admin), iso(utcnow())),
                )
            except sqlite3.IntegrityError as exc:
                raise Conflict(f"a user named {name!r} already exists", field="name") from exc
        return user

    def get_user(self, user_id: str) -> User:
        with self._lock:
            row = self._conn.execute("SELECT * FROM users WHERE id = ?", (user_id,)).fetchone()
        if row is None:
            raise NotFound(f"no user {user_id!r}", field="user")
        return _user(row)

    def find_user(self, name: str) -> User | None:
        with self._lock:
            row = self._conn.execute("SELECT * FROM users WHERE name = ?", (name,)).fetchone()
        return None if row is None else _user(row)

    def create_token(self, user_id: str, label: str) -> str:
        self.get_user(user_id)
        token = new_token()
        with self._lock:
            self._conn.execute(
                "INSERT INTO tokens VALUES (?, ?, ?, ?, ?, NULL)",
                (new_id("tok"), user_id, token_hash(token), label[:NAME_MAX], iso(utcnow())),
            )
        return token

    # -- workspaces and memberships -----------------------------------------

    def create_workspace(self, name: str) -> Workspace:
        name = _check_name("name", name)
        ws = Workspace(new_id("ws"), name, iso(utcnow()))
        with self._lock:
            try:
                self._conn.execute(
                    "INSERT INTO workspaces VALUES (?, ?, ?, NULL)", (ws.id, ws.name, ws.created_at)
                )
            except sqlite3.IntegrityError as exc:
                raise Conflict(f"a workspace named {name!r} already exists", field="name") from exc
        return ws

    def workspaces_of(self, user_id: str) -> list[Workspace]:
        with self._lock:
            rows = self._conn.execute(
                "SELECT w.* FROM workspaces w JOIN memberships m ON m.workspace_id = w.id "
                "WHERE m.user_id = ? AND w.deleted_at IS NULL ORDER BY w.created_at",
                (user_id,),
            ).fetchall()
        return [_workspace(r) for r in rows]

    def resolve_workspace(self, user_id: str, ref: str) -> Workspace:
        """A workspace by id or name that ``user_id`` is a member of.

        Not being a member and the workspace not existing are the same answer.
        """
        with self._lock:
            row = self._conn.execute(
                "SELECT w.* FROM workspaces w JOIN memberships m ON m.workspace_id = w.id "
                "WHERE m.user_id = ? AND (w.id = ? OR w.name = ?) AND w.deleted_at IS NULL",
                (user_id, ref, ref),
            ).fetchone()
        if row is None:
            raise NotFound(f"no workspace {ref!r}", field="workspace")
        return _workspace(row)

    def get_workspace(self, ref: str) -> Workspace:
        with self._lock:
            row = self._conn.execute(
                "SELECT * FROM workspaces WHERE (id = ? OR name = ?) AND deleted_at IS NULL",
                (ref, ref),
            ).fetchone()
        if row is None:
            raise NotFound(f"no workspace {ref!r}", field="workspace")
        return _workspace(row)

    def all_workspaces(self) -> list[Workspace]:
        with self._lock:
            rows = self._conn.execute(
                "SELECT * FROM workspaces WHERE deleted_at IS NULL ORDER BY created_at"
            ).fetchall()
        return [_workspace(r) for r in rows]

    def delete_workspace(self, workspace_id: str) -> None:
        """Mark deleted (rows are kept for the audit trail); memberships go."""
        with self._lock:
            self._conn.execute(
                "UPDATE workspaces SET deleted_at = ? WHERE id = ?", (iso(utcnow()), workspace_id)
            )
            self._conn.execute("DELETE FROM memberships WHERE workspace_id = ?", (workspace_id,))

    def is_member(self, workspace_id: str, user_id: str) -> bool:
        with self._lock:
            row = self._conn.execute(
                "SELECT 1 FROM memberships WHERE workspace_id = ? AND user_id = ?",
                (workspace_id, user_id),
            ).fetchone()
        return row is not None

    def add_member(self, workspace_id: str, user_id: str) -> None:
        self.get_user(user_id)
        with self._lock:
            self._conn.execute(
                "INSERT OR IGNORE INTO memberships VALUES (?, ?, ?)",
                (workspace_id, user_id, iso(utcnow())),
            )

    def remove_member(self, workspace_id: str, user_id: str) -> int:
        """Remove a membership; returns how many members remain."""
        with self._lock:
            self._conn.execute(
                "DELETE FROM memberships WHERE workspace_id = ? AND user_id = ?",
                (workspace_id, user_id),
            )
            row = self._conn.execute(
                "SELECT COUNT(*) FROM memberships WHERE workspace_id = ?", (workspace_id,)
            ).fetchone()
        return int(row[0])

    # -- rig index -----------------------------------------------------------

    def index_rig(self, rig_id: str, workspace_id: str) -> None:
        with self._lock:
            self._conn.execute("INSERT INTO rig_index VALUES (?, ?)", (rig_id, workspace_id))

    def workspace_of_rig(self, rig_id: str) -> str | None:
        with self._lock:
            row = self._conn.execute(
                "SELECT workspace_id FROM rig_index WHERE rig_id = ?", (rig_id,)
            ).fetchone()
        return None if row is None else str(row[0])

    # -- workspace settings --------------------------------------------------

    def workspace_settings(self, workspace_id: str) -> list[SettingRow]:
        """The settings set on a workspace, by key (the values as stored JSON text)."""
        with self._lock:
            rows = self._conn.execute(
                "SELECT key, value, updated_at, updated_by FROM workspace_settings "
                "WHERE workspace_id = ? ORDER BY key", (workspace_id,),
            ).fetchall()
        return [SettingRow(r["key"], r["value"], r["updated_at"], r["updated_by"]) for r in rows]

    def set_workspace_setting(self, workspace_id: str, key: str, value: str | None, user_id: str) -> None:
        """Set ``key`` to ``value`` (JSON text, already checked by its parser), or back to
        its default with ``None``."""
        with self._lock:
            if value is None:
                self._conn.execute("DELETE FROM workspace_settings WHERE workspace_id = ? AND key = ?",
                                   (workspace_id, key))
                return
            self._conn.execute(
                "INSERT INTO workspace_settings VALUES (?, ?, ?, ?, ?) ON CONFLICT (workspace_id, key) "
                "DO UPDATE SET value = excluded.value, updated_at = excluded.updated_at, "
                "updated_by = excluded.updated_by",
                (workspace_id, key, value, iso(utcnow()), user_id),
            )

    # -- page sessions ---------------------------------------------------------

    def create_session(self, user_id: str, expires: float) -> str:
        """A new session for a person; the secret is returned once and kept as a hash."""
        secret = new_token()
        with self._lock:
            self._conn.execute("INSERT INTO sessions VALUES (?, ?, ?, ?)",
                               (token_hash(secret), user_id, iso(utcnow()), expires))
        return secret

    def user_for_session(self, secret: str, now: float) -> User | None:
        with self._lock:
            row = self._conn.execute(
                "SELECT u.* FROM sessions s JOIN users u ON u.id = s.user_id "
                "WHERE s.id_sha256 = ? AND s.expires_epoch > ?", (token_hash(secret), now),
            ).fetchone()
        return None if row is None else _user(row)

    def end_session(self, secret: str, now: float) -> bool:
        with self._lock:
            cur = self._conn.execute("DELETE FROM sessions WHERE id_sha256 = ?", (token_hash(secret),))
            self._conn.execute("DELETE FROM sessions WHERE expires_epoch <= ?", (now,))
        return cur.rowcount > 0

    # -- clipboard access ------------------------------------------------------

    def clipboard_policy(self, user_id: str, now: float) -> ClipboardPolicy:
        with self._lock:
            row = self._conn.execute(
                "SELECT host_to_rig, rig_to_host FROM clipboard_policy WHERE user_id = ?", (user_id,)
            ).fetchone()
            grants = self._conn.execute(
                "SELECT rig_id, until_epoch FROM clipboard_grants WHERE user_id = ? AND until_epoch > ? "
                "ORDER BY rig_id", (user_id, now),
            ).fetchall()
        h2r, r2h = (row[0], row[1]) if row is not None else (DEFAULT_HOST_TO_RIG, DEFAULT_RIG_TO_HOST)
        return ClipboardPolicy(h2r, r2h, tuple((g[0], float(g[1])) for g in grants))

    def set_clipboard_policy(self, user_id: str, host_to_rig: str | None, rig_to_host: str | None,
                             now: float) -> ClipboardPolicy:
        for name, value in (("hostToRig", host_to_rig), ("rigToHost", rig_to_host)):
            if value is not None and value not in CLIPBOARD_CHOICES:
                raise FieldError(name, "must be allow, ask or deny")
        current = self.clipboard_policy(user_id, now)
        with self._lock:
            self._conn.execute(
                "INSERT INTO clipboard_policy VALUES (?, ?, ?, ?) ON CONFLICT (user_id) DO UPDATE "
                "SET host_to_rig = excluded.host_to_rig, rig_to_host = excluded.rig_to_host, "
                "updated_at = excluded.updated_at",
                (user_id, host_to_rig or current.host_to_rig, rig_to_host or current.rig_to_host,
                 iso(utcnow())),
            )
        return self.clipboard_policy(user_id, now)

    def clipboard_policies(self, now: float) -> list[tuple[User, ClipboardPolicy, str | None]]:
        """Every person's clipboard choices (defaults for those who never chose), by name,
        with when they last chose (None: never)."""
        with self._lock:
            rows = self._conn.execute(
                "SELECT u.*, p.host_to_rig, p.rig_to_host, p.updated_at FROM users u "
                "LEFT JOIN clipboard_policy p ON p.user_id = u.id WHERE u.kind = 'person' ORDER BY u.name"
            ).fetchall()
            grants = self._conn.execute(
                "SELECT user_id, rig_id, until_epoch FROM clipboard_grants WHERE until_epoch > ? "
                "ORDER BY rig_id", (now,),
            ).fetchall()
        by_user: dict[str, list[tuple[str, float]]] = {}
        for g in grants:
            by_user.setdefault(g["user_id"], []).append((g["rig_id"], float(g["until_epoch"])))
        return [
            (_user(r), ClipboardPolicy(r["host_to_rig"] or DEFAULT_HOST_TO_RIG,
                                       r["rig_to_host"] or DEFAULT_RIG_TO_HOST,
                                       tuple(by_user.get(r["id"], ()))), r["updated_at"])
            for r in rows
        ]

    def grant_clipboard(self, user_id: str, rig_id: str, until: float) -> None:
        with self._lock:
            self._conn.execute(
                "INSERT INTO clipboard_grants VALUES (?, ?, ?) ON CONFLICT (user_id, rig_id) DO UPDATE "
                "SET until_epoch = excluded.until_epoch", (user_id, rig_id, until),
            )
            self._conn.execute("DELETE FROM clipboard_grants WHERE until_epoch < ?", (until - 86400,))


@dataclass(frozen=True, slots=True)
class SettingRow:
    key: str
    #: JSON text.
    value: str
    updated_at: str
    updated_by: str


@dataclass(frozen=True, slots=True)
class ClipboardPolicy:
    host_to_rig: str
    rig_to_host: str
    #: (rigId, until as epoch seconds), live ones only.
    grants: tuple[tuple[str, float], ...]

    def granted(self, rig_id: str) -> bool:
        return any(r == rig_id for r, _until in self.grants)

    def to_json(self) -> dict[str, object]:
        return {"hostToRig": self.host_to_rig, "rigToHost": self.rig_to_host,
                "grants": [{"rigId": r, "until": iso(datetime.fromtimestamp(u, UTC))}
                           for r, u in self.grants]}


def _user(row: sqlite3.Row) -> User:
    return User(row["id"], row["name"], row["kind"], bool(row["is_admin"]))


def _workspace(row: sqlite3.Row) -> Workspace:
    return Workspace(row["id"], row["name"], row["created_at"])
