"""Persistent state: one server database and one SQLite database per workspace.

The classes here are synchronous and own one ``sqlite3`` connection each; the
async service reaches them through :mod:`rigd.store.aio`, which runs every call
on a worker thread, one call at a time per database. Nothing else in rigd
touches SQLite.
"""

from rigd.store.server_db import Membership, ServerDB, User, Workspace
from rigd.store.workspace_db import ActionRow, RigRow, WorkspaceDB

__all__ = [
    "ActionRow",
    "Membership",
    "RigRow",
    "ServerDB",
    "User",
    "Workspace",
    "WorkspaceDB",
]
