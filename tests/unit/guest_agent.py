"""The guest agent as the tests run it: the zipapp and launchers the tools disk carries
(:mod:`rigd.images.agent_app`), built once per test process. (The package's modules are
imported in process as ``rigd_agent.*``: pytest puts ``guest-agent/`` on ``sys.path``.)"""

from __future__ import annotations

import atexit
import functools
import shutil
import tempfile
from pathlib import Path

from rigd.images.agent_app import write_app

GUEST = Path(__file__).resolve().parents[2] / "guest-agent"
PACKAGE = GUEST / "rigd_agent"


@functools.cache
def agent_dir() -> Path:
    """A directory like the tools disk's ``agent/``: ``rigd_agent.pyz`` and its launchers."""
    where = Path(tempfile.mkdtemp(prefix="rigd-agent-app-"))
    atexit.register(shutil.rmtree, where, True)
    write_app(PACKAGE, where)
    return where


#: What ``python3 -I`` runs in a guest: the launcher, which runs the agent from the zipapp.
AGENT = agent_dir() / "rigd_agent.py"
MUX = agent_dir() / "rigd_mux.py"

__all__ = ["AGENT", "GUEST", "MUX", "PACKAGE", "agent_dir"]
