"""The agent's zipapp (rigd/images/agent_app.py): what the tools disk carries, built the same
each time, runnable as the guests run it."""

from __future__ import annotations

import io
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from rigd.images.agent_app import APP, LAUNCHERS, app_bytes, write_app
from tests.unit.guest_agent import PACKAGE


def test_the_zipapp_is_the_same_bytes_each_build_and_holds_every_module_compiled() -> None:
    first, second = app_bytes(PACKAGE), app_bytes(PACKAGE)
    assert first == second
    names = zipfile.ZipFile(io.BytesIO(first)).namelist()
    assert names == sorted(names) and names[0] == "__main__.py"
    modules = {p.name for p in PACKAGE.glob("*.py")}
    assert {n.removeprefix("rigd_agent/") for n in names if n.endswith(".py") and "/" in n} == modules
    assert {"core.py", "channel.py", "mux.py", "ops_process.py", "ops_files.py"} <= modules
    if sys.version_info[:2] == (3, 11):
        assert {n.removeprefix("rigd_agent/") for n in names if n.endswith(".pyc")} == \
            {m + "c" for m in modules}
    infos = zipfile.ZipFile(io.BytesIO(first)).infolist()
    assert {i.compress_type for i in infos} == {zipfile.ZIP_STORED}
    assert {i.date_time for i in infos} == {(1980, 1, 1, 0, 0, 0)}


@pytest.mark.timeout(60)
def test_the_zipapp_and_its_launchers_run_under_python_dash_capital_i(tmp_path: Path) -> None:
    app = write_app(PACKAGE, tmp_path / "agent")
    assert app.name == APP and {p.name for p in app.parent.iterdir()} == {APP, *LAUNCHERS}
    for argv in ([str(app)], [str(tmp_path / "agent" / "rigd_agent.py")]):
        out = subprocess.run([sys.executable, "-I", *argv, "--help"], capture_output=True, text=True,
                             timeout=30, check=True)
        assert "rigd in-guest agent" in out.stdout and "--pid1" in out.stdout, argv
    # The multiplexer's launcher: no port named rigd.ports here, so it says so and exits 1.
    mux = subprocess.run([sys.executable, "-I", str(tmp_path / "agent" / "rigd_mux.py")], capture_output=True,
                         text=True, timeout=30, check=False)
    assert mux.returncode == 1 and "no virtio port named rigd.ports" in mux.stderr

