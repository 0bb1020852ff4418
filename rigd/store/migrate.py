"""Versioned schema migrations.

Each database kind has an ordered list of migration scripts; the database's
``PRAGMA user_version`` records how many have been applied. Migrations run in
one transaction each, so a crash mid-migration leaves the previous version.
A database newer than this code is refused rather than silently misread.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence

from rigd.errors import RigdError


def connect(path: str) -> sqlite3.Connection:
    """Open a database with the settings every rigd database uses.

    WAL lets readers proceed beside the single writer; ``synchronous=FULL``
    makes every committed row survive a power cut as well as a ``kill -9``.
    """
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=30)
    conn.row_factory = sqlite3.Row
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=FULL")
    conn.execute("PRAGMA foreign_keys=ON")
    return conn


def migrate(conn: sqlite3.Connection, migrations: Sequence[str], *, kind: str) -> int:
    """Bring ``conn`` up to ``len(migrations)``; returns the resulting version."""
    version = int(conn.execute("PRAGMA user_version").fetchone()[0])
    if version > len(migrations):
        raise RigdError(
            f"{kind} database is at schema version {version}, newer than this rigd "
            f"understands ({len(migrations)}); refusing to touch it"
        )
    for index in range(version, len(migrations)):
        conn.execute("BEGIN IMMEDIATE")
        try:
            for statement in _split(migrations[index]):
                conn.execute(statement)
            conn.execute(f"PRAGMA user_version={index + 1}")
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
    return len(migrations)


def _split(script: str) -> list[str]:
    """Split a migration script into statements.

    ``executescript`` would commit implicitly; running statements one by one
    keeps a migration inside its own transaction. Migration scripts contain no
    semicolons inside string literals or triggers, which keeps this simple.
    """
    return [part.strip() for part in script.split(";") if part.strip()]
