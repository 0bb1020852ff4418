"""A failed test keeps its evidence, a passing one keeps none: an inner pytest
run (pytester, in a subprocess so its fixtures' state is its own) against real
``rigd serve`` processes that boot no VM (``--no-warm-starts``, no rig opened).

The rig files come from :func:`rigd.backends.evidence.write_evidence`, called
by the inner test where a machine's teardown would call it, with the
``RIGD_EVIDENCE_DIR`` the fixture gave its server. The QMP transcript is
checked against a real QEMU (``-M none``: no guest, no boot).
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio

from rigd.backends.evidence import ENV, write_evidence
from rigd.backends.qmp_client import QMPConnection
from rigd.errors import BackendError
from rigd.images.cache import default_cache_dir
from rigd.protocols import input as qin
from tests.integration.conftest import REPO, TestEvidence

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


@pytest.fixture
def teardown_fails(quiet_server: Server):
    yield quiet_server
    raise AssertionError("deliberately failed in teardown")


def test_passes_but_its_teardown_fails(teardown_fails: Server) -> None:
    assert teardown_fails.call("workspace.list")[0]["name"] == "default"


def test_cleanup_failure_is_reported(tmp_path: Path) -> None:
    not_a_dir = tmp_path / "plain-file"
    not_a_dir.write_text("x")
    remove_tree(not_a_dir)  # NotADirectoryError: logged and listed, not raised
'''


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

    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", timeout=240)

    result.assert_outcomes(passed=3, failed=1, errors=1)
    kept, kept_teardown = sorted(artifacts.iterdir())
    assert kept.name == "test_inner.py-test_fails"
    assert kept_teardown.name == "test_inner.py-test_passes_but_its_teardown_fails"
    [teardown_home] = list(kept_teardown.iterdir())
    assert "received SIGTERM" in (teardown_home / "server.log").read_text()
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
    assert "cleanups and evidence copies that failed" in out and "plain-file: [Errno 20] Not a directory" in out
    # Nothing of the passing test, nor the run's homes, is left anywhere.
    assert Path(failed_home).parent == Path(passed_home).parent
    assert not Path(failed_home).parent.exists()


@pytest.fixture
def bare_qemu(tmp_path: Path, evidence: TestEvidence) -> Iterator[Path]:
    """A QEMU with no machine and a QMP socket; killed by PID at the end."""
    if shutil.which("qemu-system-x86_64") is None:
        pytest.skip("needs QEMU")
    sock = tmp_path / "qmp.sock"
    with (tmp_path / "qemu.stderr").open("wb") as err:
        proc = subprocess.Popen(["qemu-system-x86_64", "-M", "none", "-display", "none", "-nodefaults",
                                 "-qmp", f"unix:{sock},server=on,wait=off"],
                                stdin=subprocess.DEVNULL, stdout=err, stderr=err)
    evidence.keep(tmp_path / "qemu.stderr", "qemu-stderr.log")
    try:
        deadline = time.monotonic() + 30
        while not sock.exists():
            assert proc.poll() is None and time.monotonic() < deadline, "QEMU made no QMP socket"
            time.sleep(0.01)
        yield sock
    finally:
        if proc.poll() is None:
            proc.kill()  # by PID: Popen.kill signals exactly this process
        proc.wait(timeout=10)


@pytest.mark.timeout(60)
async def test_a_real_qemu_transcript_keeps_the_conversation_not_the_keys(
        bare_qemu: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    conn = await QMPConnection.connect(bare_qemu, log=logging.getLogger("rigd.rig.r-bare"))
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(conn.run)
            await conn.handshake(10)
            assert (await conn.execute("query-status"))["status"] == "running"
            typed = [e for step in qin.plan_typing("hunter2") if isinstance(step, list) for e in step]
            with pytest.raises(BackendError):  # no keyboard on -M none: QEMU refuses
                await conn.execute("input-send-event", {"events": typed})
            with pytest.raises(BackendError) as bogus:  # QEMU's error quotes the value it rejected
                await conn.execute("send-key", {"keys": [{"type": "qcode", "data": "hunter2"}]})
            assert "hunter2" in str(bogus.value)
            await conn.execute("stop")
            await conn.send_only("quit")
    finally:
        await conn.aclose()
    transcript = conn.transcript()
    got = [line.split(maxsplit=1)[1] for line in transcript.splitlines()[1:]]
    assert got[0].startswith("<- greeting {") and "qemu" in got[0], transcript
    assert got[1:10] == [
        "-> qmp_capabilities id=1",
        "<- return id=1 {}",
        "-> query-status id=2",
        '<- return id=2 {"running": true, "singlestep": false, "status": "running"}',
        f"-> input-send-event [key:{len(typed)}] id=3",
        "<- error id=3 GenericError (reply to input-send-event: description withheld)",
        "-> send-key (arguments withheld: keys) id=4",
        "<- error id=4 GenericError (reply to send-key: description withheld)",
        "-> stop id=5",
    ], transcript
    # An event and its command's reply come in QEMU's order, whichever that is.
    assert got[10:12] in (["<- event STOP {}", "<- return id=5 {}"], ["<- return id=5 {}", "<- event STOP {}"])
    assert got[12] == "-> quit id=6" and got[-1] == "-- connection closed"
    assert sorted(got[13:-1]) == ['<- event SHUTDOWN {"guest": false, "reason": "host-qmp-quit"}',
                                  "<- return id=6 {}"], transcript
    assert "hunter" not in transcript and "qcode" not in transcript

    monkeypatch.setenv(ENV, str(tmp_path / "evidence"))
    write_evidence("r-bare", console="", qmp=transcript, stderr="", log=logging.getLogger("rigd.rig.r-bare"))
    assert (tmp_path / "evidence" / "r-bare" / "qmp.log").read_text() == transcript
