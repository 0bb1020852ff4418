"""The one adapter between the Trio service and SQLite.

aiosqlite would need an asyncio loop; the stdlib ``sqlite3`` driver on worker
threads needs nothing (docs/decisions.md). Every call runs in
``trio.to_thread.run_sync``; the stores' own locks serialise access per
database, and a shared limiter caps the threads SQLite may occupy.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path
from typing import ParamSpec, TypeVar

import trio

from rigd.store.server_db import ServerDB
from rigd.store.workspace_db import WorkspaceDB

P = ParamSpec("P")
T = TypeVar("T")


class Stores:
    """Owns the server database and every open workspace database."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        (data_dir / "workspaces").mkdir(parents=True, exist_ok=True)
        self.server = ServerDB(data_dir / "server.db")
        self._workspaces: dict[str, WorkspaceDB] = {}
        self._limiter = trio.CapacityLimiter(4)

    async def run(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """Run one blocking store call on a worker thread."""
        return await trio.to_thread.run_sync(
            functools.partial(fn, *args, **kwargs), limiter=self._limiter
        )

    def workspace_sync(self, workspace_id: str) -> WorkspaceDB:
        db = self._workspaces.get(workspace_id)
        if db is None:
            db = WorkspaceDB(self.data_dir / "workspaces" / f"{workspace_id}.db", workspace_id)
            self._workspaces[workspace_id] = db
        return db

    async def workspace(self, workspace_id: str) -> WorkspaceDB:
        db = self._workspaces.get(workspace_id)
        if db is None:
            db = await self.run(self.workspace_sync, workspace_id)
        return db

    def close(self) -> None:
        for db in self._workspaces.values():
            db.close()
        self._workspaces.clear()
        self.server.close()
