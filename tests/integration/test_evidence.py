"""A failed test keeps its evidence, a passing one keeps none: an inner pytest
run (pytester, in a subprocess so its fixtures' state is its own) against real
``rigd serve`` processes that boot no VM (``--no-warm-starts``, no rig opened).

The rig files come from :func:`rigd.backends.evidence.write_evidence`, called
by the inner test where a machine's teardown would call it, with the
``RIGD_EVIDENCE_DIR`` the fixture gave its server.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from rigd.images.cache import default_cache_dir
from tests.integration.conftest import REPO

pytest_plugins = ["pytester"]
pytestmark = [pytest.mark.timeout(300)]
#: Read at import: the pytester fixture moves HOME, where the default cache lives.
CACHE_DIR = default_cache_dir()

INNER_CONFTEST = '''
pytest_plugins = ["tests.integration.conftest"]
'''

INNER_TESTS = '''
import logging
import os
from pathlib import Path

import pytest

from rigd.backends.evidence import write_evidence
from tests.integration.conftest import Server, make_data_dir, remove_tree, serving


@pytest.fixture
def quiet_server():
    with serving(make_data_dir(), "--no-warm-starts") as srv:
        yield srv


def rig_teardown_stand_in(srv: Server) -> None:
    """What a machine's teardown writes, into the server's own evidence directory."""
    os.environ["RIGD_EVIDENCE_DIR"] = str(srv.home / "rigs")
    try:
        write_evidence("r-inner", console="RIGD-AGENT-READY\\n", qmp="+0.000000 -> stop id=1\\n",
                       stderr="qemu: terminating on signal 15\\n", log=logging.getLogger("rigd.rig.r-inner"))
    finally:
        del os.environ["RIGD_EVIDENCE_DIR"]


def test_fails(quiet_server: Server, evidence) -> None:
    assert quiet_server.call("workspace.list")[0]["name"] == "default"
    rig_teardown_stand_in(quiet_server)
    console = Path(os.environ["INNER_CONSOLE"])
    console.write_text("raw QEMU console\\n")
    evidence.keep(console, "vm0-console.log")
    Path(os.environ["INNER_HOMES"]).write_text(str(quiet_server.home))
    raise AssertionError("deliberately failed")


def test_passes(quiet_server: Server) -> None:
    assert quiet_server.call("workspace.list")[0]["name"] == "default"
    rig_teardown_stand_in(quiet_server)
    with open(os.environ["INNER_HOMES"], "a") as f:
        f.write("\\n" + str(quiet_server.home))


def test_cleanup_failure_is_reported(tmp_path: Path) -> None:
    not_a_dir = tmp_path / "plain-file"
    not_a_dir.write_text("x")
    remove_tree(not_a_dir)  # NotADirectoryError: logged and listed, not raised
'''


def evidence_roots() -> set[Path]:
    return set(Path("/var/tmp").glob("rigd-evidence-*"))


def test_failed_test_keeps_server_log_and_rig_evidence_passing_keeps_none(
        pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    artifacts = tmp_path / "artifacts"
    homes = tmp_path / "homes.txt"
    monkeypatch.setenv("RIGD_TEST_ARTIFACTS", str(artifacts))
    monkeypatch.setenv("INNER_CONSOLE", str(tmp_path / "console.log"))
    monkeypatch.setenv("INNER_HOMES", str(homes))
    monkeypatch.setenv("RIGD_CACHE_DIR", str(CACHE_DIR))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    pytester.makeconftest(INNER_CONFTEST)
    pytester.makepyfile(test_inner=INNER_TESTS)
    roots_before = evidence_roots()

    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", timeout=240)

    result.assert_outcomes(passed=2, failed=1)
    [kept] = list(artifacts.iterdir())
    assert kept.name == "test_inner.py-test_fails"
    failed_home, passed_home = homes.read_text().split()
    server_dir = kept / Path(failed_home).name
    assert sorted(p.name for p in kept.iterdir()) == sorted([server_dir.name, "vm0-console.log"])
    log = (server_dir / "server.log").read_text()
    # Copied after the fixture stopped the server: the log is whole.
    assert "accel tcg)" in log and "received SIGTERM; closing every rig" in log, log[-2000:]
    rig = server_dir / "rigs" / "r-inner"
    assert (rig / "console.log").read_text() == "RIGD-AGENT-READY\n"
    assert (rig / "qmp.log").read_text() == "+0.000000 -> stop id=1\n"
    assert (rig / "qemu-stderr.log").read_text() == "qemu: terminating on signal 15\n"
    assert (kept / "vm0-console.log").read_text() == "raw QEMU console\n"
    # The path is in the failure's report and in the run's summary.
    out = result.stdout.str()
    assert f"evidence kept in {kept}" in out
    assert f"test_inner.py::test_fails: {kept}" in out
    # The cleanup that failed is named with its path and error, and did not fail its test.
    assert "cleanups that failed" in out and "plain-file: [Errno 20] Not a directory" in out
    # Nothing of the passing test, nor the run's homes, is left anywhere.
    assert Path(failed_home).parent == Path(passed_home).parent
    assert not Path(failed_home).parent.exists()
    assert evidence_roots() <= roots_before
