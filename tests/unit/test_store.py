"""Store: schema versions, bootstrap, memberships, and the action log."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from rigd.errors import Conflict, NotFound, RigdError
from rigd.store.migrate import connect, migrate
from rigd.store.server_db import ServerDB
from rigd.store.workspace_db import RigRow, WorkspaceDB


def _row(rig_id: str, ws: str = "ws_1", phase: str = "ready") -> RigRow:
    return RigRow(
        id=rig_id, workspace_id=ws, conversation="c1", surface="terminal", engine=None,
        backend="smolvm", accel="tcg", phase=phase, phase_detail="", close_reason=None,
        failure=None, display_w=None, display_h=None, memory_mb=512, vcpus=2, ttl_s=60,
        idle_s=60, image=None, exec_image=True, created_by="usr_1", controller_kind=None,
        controller_id=None, created_at="2026-01-01T00:00:00.000Z",
        last_active_at="2026-01-01T00:00:00.000Z", expires_at="2026-01-01T01:00:00.000Z",
        closed_at=None, pid=None, pid_start_ticks=None, console_tail=None,
    )


def test_bootstrap_creates_admin_and_default_workspace_once(tmp_path: Path) -> None:
    db = ServerDB(tmp_path / "server.db")
    admin, ws, token = db.bootstrap()
    assert admin.is_admin and ws.name == "default" and token is not None
    assert db.user_for_token(token) == admin
    assert db.is_member(ws.id, admin.id)
    db.close()
    again = ServerDB(tmp_path / "server.db")
    admin2, ws2, token2 = again.bootstrap()
    assert (admin2, ws2, token2) == (admin, ws, None)
    # Only the hash is stored: the token text is nowhere in the database file.
    assert token.encode() not in (tmp_path / "server.db").read_bytes()
    again.close()


def test_workspace_membership_hides_foreign_workspaces(tmp_path: Path) -> None:
    db = ServerDB(tmp_path / "server.db")
    admin, ws, _ = db.bootstrap()
    bob = db.create_user("bob")
    other = db.create_workspace("other")
    assert db.resolve_workspace(admin.id, "default").id == ws.id
    with pytest.raises(NotFound) as exc:
        db.resolve_workspace(bob.id, "default")
    assert exc.value.data["field"] == "workspace"
    db.add_member(other.id, bob.id)
    assert [w.name for w in db.workspaces_of(bob.id)] == ["other"]
    with pytest.raises(Conflict):
        db.create_workspace("other")
    assert db.remove_member(other.id, bob.id) == 0


def test_action_sequence_only_grows_across_reopen(tmp_path: Path) -> None:
    path = tmp_path / "ws.db"
    db = WorkspaceDB(path, "ws_1")
    db.insert_rig(_row("rig_a"))
    seqs = [db.begin_action("rig_a", actor_kind="agent", actor_id="u", tool="terminal_use",
                            verb="exec", args={"n": i}) for i in range(3)]
    db.close()
    db = WorkspaceDB(path, "ws_1")
    seqs.append(db.begin_action("rig_a", actor_kind="agent", actor_id="u", tool="terminal_use",
                                verb="exec", args={}))
    assert seqs == [1, 2, 3, 4]
    # Another rig has its own sequence.
    assert db.begin_action("rig_b", actor_kind="agent", actor_id="u", tool="t", verb="v", args={}) == 1
    db.finish_action("rig_a", 4, outcome="ok", error=None, duration_ms=5)
    assert db.abandon_pending() == 4  # rig_a 1-3 and rig_b 1 were left pending
    outcomes = [(a.seq, a.outcome) for a in db.actions("rig_a")]
    assert outcomes == [(1, "interrupted"), (2, "interrupted"), (3, "interrupted"), (4, "ok")]


def test_closed_rigs_keep_rows(tmp_path: Path) -> None:
    db = WorkspaceDB(tmp_path / "ws.db", "ws_1")
    db.insert_rig(_row("rig_a"))
    db.update_rig("rig_a", phase="closed", close_reason="requested")
    assert db.live_rigs() == []
    assert db.get_rig("rig_a").close_reason == "requested"
    with pytest.raises(ValueError):
        db.update_rig("rig_a", no_such_column=1)


def test_database_newer_than_code_is_refused(tmp_path: Path) -> None:
    conn = connect(str(tmp_path / "x.db"))
    conn.execute("PRAGMA user_version=7")
    with pytest.raises(RigdError, match="newer"):
        migrate(conn, ["CREATE TABLE t (x)"], kind="test")


def test_failed_migration_rolls_back(tmp_path: Path) -> None:
    conn = connect(str(tmp_path / "x.db"))
    with pytest.raises(sqlite3.OperationalError):
        migrate(conn, ["CREATE TABLE a (x); CREATE TABLE a (y)"], kind="test")
    assert conn.execute("PRAGMA user_version").fetchone()[0] == 0
    assert conn.execute("SELECT name FROM sqlite_master WHERE name='a'").fetchone() is None
