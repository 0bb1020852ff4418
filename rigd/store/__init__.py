"""Persistent state: one server database and one SQLite database per workspace.

The classes here are synchronous and own one ``sqlite3`` connection each; the
async service reaches them through :mod:`rigd.store.aio`, which runs every call
on a worker thread, one call at a time per database. Nothing else in rigd
touches SQLite.
"""

from rigd.store.server_db import Membership, ServerDB, SettingRow, User, Workspace
from rigd.store.workspace_db import ActionRow, GuardRow, RigRow, WorkspaceDB

__all__ = [
    "ActionRow",
    "GuardRow",
    "Membership",
    "RigRow",
    "ServerDB",
    "SettingRow",
    "User",
    "Workspace",
    "WorkspaceDB",
]
