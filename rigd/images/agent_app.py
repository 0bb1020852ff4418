"""The guest agent as one zipapp: ``rigd_agent.pyz``, built with the tools disk.

The agent is a package (``guest-agent/rigd_agent/``, one module per concern). The tools
disk carries it as a single zip that ``python3 -I rigd_agent.pyz`` runs (its root
``__main__.py`` calls :func:`rigd_agent.main.main`), plus two launchers at the paths
images, the stage-2 init and the port forwards have always started —
``agent/rigd_agent.py`` and ``agent/rigd_mux.py`` — which put the zip on ``sys.path``
and run the agent or the port multiplexer from it. So a change to the agent rebuilds
the small tools disk only, never a desktop or browser image.

The zip is deterministic (sorted entries, a fixed date, stored uncompressed: the guest's
``zipimport`` then needs no zlib). Next to each module it holds an ``unchecked-hash``
``.pyc`` compiled by this interpreter when it is a Python 3.11 (the guests' own minor
version, so the magic number matches): the disk is read-only in the guest, and compiling
~4,000 lines at each agent start costs time under TCG. A guest interpreter whose magic
differs ignores the ``.pyc`` and compiles the source.
"""

from __future__ import annotations

import io
import py_compile
import sys
import tempfile
import zipfile
from pathlib import Path

APP = "rigd_agent.pyz"
#: Launcher file -> the module it runs from the zip (as ``__main__``).
LAUNCHERS = {"rigd_agent.py": "rigd_agent", "rigd_mux.py": "rigd_agent.mux"}
#: The guests' Python (the tools disk's runtime and the desktop's Debian 12 interpreter).
GUEST_PYTHON = (3, 11)
ROOT_MAIN = b'"""Run the rigd guest agent."""\n\nfrom rigd_agent.main import main\n\nmain()\n'
_DATE = (1980, 1, 1, 0, 0, 0)


def package_files(package: Path) -> list[Path]:
    """The package's modules, in a stable order (what the zip and the disk's key hold)."""
    return sorted(package.glob("*.py"))


def launcher(module: str) -> str:
    """A launcher's text: run ``module`` from the zip beside it, as ``python3 -I`` runs scripts."""
    return (
        f'"""Runs {module} from {APP} beside this file (the path images and init start)."""\n\n'
        "import os\nimport runpy\nimport sys\n\n"
        f'sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "{APP}"))\n'
        f'runpy.run_module("{module}", run_name="__main__", alter_sys=True)\n'
    )


def _pyc(source: Path, name: str) -> bytes | None:
    if sys.version_info[:2] != GUEST_PYTHON:
        return None
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "m.pyc"
        py_compile.compile(str(source), cfile=str(out), dfile=name, doraise=True,
                           invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH)
        return out.read_bytes()


def app_bytes(package: Path) -> bytes:
    """The zipapp of ``package`` (a ``rigd_agent`` directory), byte for byte the same each build."""
    entries: dict[str, bytes] = {"__main__.py": ROOT_MAIN}
    for path in package_files(package):
        name = f"rigd_agent/{path.name}"
        entries[name] = path.read_bytes()
        pyc = _pyc(path, name)
        if pyc is not None:
            entries[name[:-3] + ".pyc"] = pyc
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_STORED) as z:
        for name in sorted(entries):
            info = zipfile.ZipInfo(name, date_time=_DATE)
            info.external_attr = 0o644 << 16
            z.writestr(info, entries[name])
    return buf.getvalue()


def write_app(package: Path, directory: Path) -> Path:
    """Write the zipapp and both launchers into ``directory``; the zipapp's path."""
    directory.mkdir(parents=True, exist_ok=True)
    app = directory / APP
    app.write_bytes(app_bytes(package))
    for name, module in LAUNCHERS.items():
        (directory / name).write_text(launcher(module))
    return app


__all__ = ["APP", "LAUNCHERS", "app_bytes", "launcher", "package_files", "write_app"]
