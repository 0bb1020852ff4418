"""Where a server keeps its data by default: the one fact the command-line clients need
to find a local server (``server.json``) and its token (``admin.token``). Kept apart from
:mod:`rigd.server` so that ``rigd list`` or ``rigd act`` imports a few standard modules, not
the server (issue 28: a client call spent ~1.8 s importing it)."""

from __future__ import annotations

import os
from pathlib import Path


def default_data_dir() -> Path:
    """``/var/lib/rigd`` for root (rigs' uids cannot enter a private home), else the
    user's XDG data directory."""
    if os.geteuid() == 0:
        return Path("/var/lib/rigd")
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "rigd"


__all__ = ["default_data_dir"]
