"""Real-server fixtures: a ``rigd serve`` subprocess under TCG with its own
data directory, and a client for it.

The fixture owns every QEMU its server starts: at teardown it stops the
server (SIGTERM, which closes every rig), then kills by pid any QEMU whose
command line still names its data directory, and fails the test if it had
to. Console output of rigs that failed is printed for the report.

Evidence of a failed test (as QEMU's avocado tests and Firecracker's test
framework keep it): every server logs to, and its rigs leave their console,
QMP transcript and QEMU stderr (``RIGD_EVIDENCE_DIR``) in, a home of its own
outside its data directory. When a test fails in setup, call or teardown,
the homes of the servers it used and the files it named with
:meth:`TestEvidence.keep` (raw QEMU consoles) are copied to
``${RIGD_TEST_ARTIFACTS:-<repo>/test-artifacts}/<test id>/`` and the path is
printed in its report; a passing test keeps nothing. A cleanup that fails
(:func:`remove_tree`) is logged and listed at the end of the run, never
fatal and never silent.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import io
import json
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Generator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from PIL import Image

from rigd.backends import evidence as rig_evidence
from rigd.backends.desktop_argv import desktop_argv
from rigd.backends.microvm_argv import default_tcg_threads
from rigd.client.cli import Client, ClientError
from rigd.images import find_assets
from rigd.images.desktop import DesktopImage

REPO = Path(__file__).resolve().parents[2]
#: Packs are expensive (the image unpacked into an ext4 file); tests share one
#: directory of them, outside any private home so rig uids can read them.
SHARED_PACKS = Path(os.environ.get("RIGD_TEST_PACKS", "/var/tmp/rigd-test-packs"))
#: Where a failed test's evidence is kept, one directory per test.
ARTIFACTS = Path(os.environ.get("RIGD_TEST_ARTIFACTS") or REPO / "test-artifacts")

log = logging.getLogger("rigd.tests")


# -- evidence of a failed test, and cleanups that fail ------------------------------------------

#: Problems the run should hear about at its end, whatever the tests' outcomes.
_CLEANUP_FAILURES: list[str] = []
#: (test id, directory) of each failed test's kept evidence.
_KEPT: list[tuple[str, Path]] = []
#: Shared rigs a test left unhealthy, replaced before the next test (:class:`SharedRig`).
_REOPENED: list[str] = []
#: Lazily made; holds one home per server data directory; removed at the end of the session.
_HOMES_ROOT: Path | None = None


def cleanup_failed(what: str) -> None:
    """Record a cleanup (or an evidence copy) that did not work: a warning now,
    a line in the run's summary."""
    log.warning("cleanup failed: %s", what)
    _CLEANUP_FAILURES.append(what)


def remove_tree(path: Path) -> None:
    """Remove a test's directory; a failure is logged with the path and the
    error (and what can be removed still is), never raised."""
    try:
        shutil.rmtree(path)
    except FileNotFoundError:
        return
    except OSError as exc:
        cleanup_failed(f"cannot remove {path}: {exc}")
        shutil.rmtree(path, ignore_errors=True)


@dataclass
class TestEvidence:
    """What a test has touched that is worth keeping if it fails."""

    __test__ = False  # not a test class, whatever its name says

    #: Homes of servers started during the test, or already running when it began.
    homes: set[Path] = field(default_factory=set)
    #: Files the test asked to keep, by the name they get in the artifact directory.
    files: dict[str, Path] = field(default_factory=dict)
    #: Homes of servers started during the test: dropped when it passes.
    started: set[Path] = field(default_factory=set)

    def keep(self, path: Path, name: str | None = None) -> None:
        """Copy ``path`` (a file; it may appear later) into the artifacts if the test fails."""
        self.files[name or path.name] = path


_ACTIVE: TestEvidence | None = None
#: Every server process started with a home, to tell which homes are still in use.
_SERVERS: list[tuple[subprocess.Popen[bytes], Path]] = []
_EVIDENCE = pytest.StashKey[TestEvidence]()
_REPORTS = pytest.StashKey[dict[str, pytest.TestReport]]()


def server_home(data_dir: Path) -> Path:
    """The home of the server on ``data_dir``: its log (``server.log``) and its
    rigs' evidence (``rigs/``, the server's ``RIGD_EVIDENCE_DIR``). It lies outside
    the data directory, which a test removes before its evidence is collected; a
    restart on the same data directory shares it."""
    global _HOMES_ROOT
    if _HOMES_ROOT is None:
        _HOMES_ROOT = Path(tempfile.mkdtemp(prefix="rigd-evidence-", dir="/var/tmp"))
        os.chmod(_HOMES_ROOT, 0o711)  # an unprivileged server reaches its own home
    home = _HOMES_ROOT / data_dir.name
    home.mkdir(mode=0o711, exist_ok=True)
    (home / "rigs").mkdir(mode=0o700, exist_ok=True)
    if _ACTIVE is not None:
        _ACTIVE.homes.add(home)
        _ACTIVE.started.add(home)
    return home


def track_server(proc: subprocess.Popen[bytes], home: Path) -> None:
    """Note a server process and its home (for one started without :func:`start_server`)."""
    _SERVERS.append((proc, home))


def _running_homes() -> set[Path]:
    return {home for proc, home in _SERVERS if proc.poll() is None}


@pytest.fixture(autouse=True)
def evidence(request: pytest.FixtureRequest) -> Iterator[TestEvidence]:
    """The test's evidence (first set up, last torn down; the hook below keeps or drops it)."""
    global _ACTIVE
    ev = TestEvidence(homes=_running_homes())  # module-scoped servers serve this test too
    request.node.stash[_EVIDENCE] = ev
    _ACTIVE = ev
    try:
        yield ev
    finally:
        _ACTIVE = None


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[
        None, pytest.TestReport, pytest.TestReport]:
    """Keep each phase's report on the item; after teardown, keep or drop the evidence.

    This runs at the teardown report rather than in the fixture's teardown so
    that a failure in another fixture's teardown (a leaked QEMU) counts too."""
    report = yield
    reports = item.stash.setdefault(_REPORTS, {})
    reports[report.when] = report
    ev = item.stash.get(_EVIDENCE, None)
    if report.when == "teardown" and ev is not None:
        if any(r.failed for r in reports.values()):
            dest = _keep(item.nodeid, ev.homes | _running_homes(), ev.files)
            if dest is not None:
                line = f"evidence kept in {dest}"
                for r in reports.values():
                    if r.failed:  # the report pytest prints for this test
                        r.sections.append(("rigd test artifacts", line))
                _KEPT.append((item.nodeid, dest))
        else:
            for home in ev.started - _running_homes():
                remove_tree(home)
    return report


def _artifact_name(nodeid: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", nodeid).strip("-.")[:180] or "test"


def _keep(nodeid: str, homes: set[Path], files: dict[str, Path]) -> Path | None:
    if not homes and not files:
        return None
    dest = ARTIFACTS / _artifact_name(nodeid)
    remove_tree(dest)  # a rerun replaces what an earlier run kept
    try:
        dest.mkdir(parents=True)
    except OSError as exc:
        cleanup_failed(f"cannot keep the evidence of {nodeid} in {dest}: {exc}")
        return None
    for home in sorted(homes):
        try:
            shutil.copytree(home, dest / home.name, symlinks=True, dirs_exist_ok=True)
        except (OSError, shutil.Error) as exc:
            cleanup_failed(f"cannot copy {home} to {dest}: {exc}")
    for name, path in files.items():
        if not path.exists():
            continue  # the test failed before it was written
        try:
            shutil.copy2(path, dest / name, follow_symlinks=False)
        except OSError as exc:
            cleanup_failed(f"cannot copy {path} to {dest}: {exc}")
    return dest


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if _KEPT:
        terminalreporter.section("rigd test artifacts (failed tests)")
        for nodeid, dest in _KEPT:
            terminalreporter.write_line(f"{nodeid}: {dest}")
    if _REOPENED:
        terminalreporter.section("shared rigs replaced after a test left them unhealthy")
        for what in _REOPENED:
            terminalreporter.write_line(what)
    if _CLEANUP_FAILURES:
        terminalreporter.section("cleanups and evidence copies that failed")
        for what in _CLEANUP_FAILURES:
            terminalreporter.write_line(what)


def pytest_sessionfinish(session: pytest.Session) -> None:
    if _HOMES_ROOT is not None:
        remove_tree(_HOMES_ROOT)
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:  # a pytest-xdist worker: the controller prints the summary
        workeroutput["rigd"] = {"kept": [[n, str(d)] for n, d in _KEPT], "reopened": _REOPENED,
                                "cleanups": _CLEANUP_FAILURES}


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: Any) -> None:
    """(pytest-xdist, on the controller) A worker's kept evidence, replaced rigs and failed
    cleanups join the controller's, for the summary."""
    got = getattr(node, "workeroutput", {}).get("rigd")
    if got:
        _KEPT.extend((n, Path(d)) for n, d in got["kept"])
        _REOPENED.extend(got["reopened"])
        _CLEANUP_FAILURES.extend(got["cleanups"])


def qemu_pids_for(marker: str) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if b"qemu-system" in cmdline and marker.encode() in cmdline:
            pids.append(int(entry.name))
    return pids


@dataclass
class Server:
    data_dir: Path
    proc: subprocess.Popen[bytes]
    url: str
    token: str
    log_path: Path
    #: See :func:`server_home`; None for a server started without one.
    home: Path | None = None
    client: Client = field(init=False)

    def __post_init__(self) -> None:
        self.client = Client(self.url, self.token)

    def call(self, method: str, params: dict[str, Any] | None = None, *, token: str | None = None) -> Any:
        client = self.client if token is None else Client(self.url, token)
        return client.call(method, params)

    def error(self, method: str, params: dict[str, Any] | None = None, *, token: str | None = None) -> dict[str, Any]:
        """Call and expect a JSON-RPC error; return the raw error object."""
        import urllib.request

        body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": method, "params": params or {}})
        req = urllib.request.Request(
            self.url + "/rpc", data=body.encode(), method="POST",
            headers={"Authorization": f"Bearer {token or self.token}"},
        )
        try:
            with urllib.request.urlopen(req, timeout=120) as resp:
                reply = json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            with exc:
                reply = json.loads(exc.read())
        assert "error" in reply, reply
        return dict(reply["error"])

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 60) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        return self.proc.returncode


def raw_desktop_argv(image: DesktopImage, run_dir: Path) -> list[str]:
    """A thin overlay of the desktop image in ``run_dir`` and the argv of a
    plain TCG machine booting it (sockets in ``run_dir``; the tools disk, with
    the guest agent, as a server attaches it), without a server."""
    overlay = run_dir / "disk.qcow2"
    subprocess.run(
        ["qemu-img", "create", "-q", "-f", "qcow2", "-F", "qcow2", "-b", str(image.disk), str(overlay)],
        check=True,
    )
    return desktop_argv(
        qemu="qemu-system-x86_64", accel="tcg", tcg_threads=default_tcg_threads(), memory_mb=2048, vcpus=2,
        disk_overlay=overlay,
        kernel=image.kernel, initrd=image.initrd, cmdline_extra=image.cmdline,
        tools_disk=find_assets().tools,
        qmp_socket=run_dir / "qmp.sock", agent_socket=run_dir / "agent.sock",
        console_socket=run_dir / "console.sock", width=image.manifest.width,
        height=image.manifest.height,
    )


def make_data_dir() -> Path:
    d = Path(tempfile.mkdtemp(prefix="rigd-test-", dir="/var/tmp"))
    os.chmod(d, 0o711)
    (d / "rigs").mkdir(mode=0o711)
    _link_shared_packs(d / "rigs")
    return d


def _link_shared_packs(rigs: Path) -> None:
    SHARED_PACKS.mkdir(parents=True, exist_ok=True)
    os.chmod(SHARED_PACKS, 0o711)
    (rigs / "smolvm-packs").symlink_to(SHARED_PACKS)
    # Browser packs (one per engine): ensure_browser_pack(…, SHARED_PACKS) makes them there too.
    browser_packs = SHARED_PACKS / "rigs" / "browser-packs"
    browser_packs.mkdir(parents=True, exist_ok=True)
    for shared in (browser_packs.parent, browser_packs):
        os.chmod(shared, 0o711)
    (rigs / "browser-packs").symlink_to(browser_packs)


def reused_data_dir(path: Path, keep_image: str | None) -> Path:
    """``path`` as a data directory that keeps one imported image from run to run
    (``rigs/images/<keep_image>``, with the warm-start snapshots built next to it) and
    starts everything else afresh: databases, tokens, rigs, other imports."""
    rigs = path / "rigs"
    images = rigs / "images"
    rigs.mkdir(mode=0o711, parents=True, exist_ok=True)
    for parent, kept in ((path, "rigs"), (rigs, "images"), (images, keep_image)):
        if not parent.is_dir():
            continue
        for entry in parent.iterdir():
            if entry.name == kept:
                continue
            if entry.is_dir() and not entry.is_symlink():
                remove_tree(entry)
            else:
                entry.unlink()
    os.chmod(path, 0o711)
    os.chmod(rigs, 0o711)
    _link_shared_packs(rigs)
    return path


def start_server(data_dir: Path, *extra: str) -> Server:
    """``rigd serve`` on ``data_dir`` under TCG. Its pools are off (``--pool none``) unless
    ``extra`` names some: a pool boots rigs in the background, which only the tests of pools
    (and those that take rigs from them) should pay for."""
    home = server_home(data_dir)
    if "--pool" not in extra:
        extra = ("--pool", "none", *extra)
    log_path = home / "server.log"
    (data_dir / "server.json").unlink(missing_ok=True)
    env = {**os.environ, rig_evidence.ENV: str(home / "rigs")}
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "rigd", "serve", "--data-dir", str(data_dir), "--port", "0",
             "--accel", "tcg", "--log-level", "info", *extra],
            stdout=log, stderr=subprocess.STDOUT, cwd=REPO, env=env,
        )
    track_server(proc, home)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"rigd serve exited ({proc.returncode}):\n{log_path.read_text()}")
        try:
            url = json.loads((data_dir / "server.json").read_text())["url"]
            token = (data_dir / "admin.token").read_text().strip()
            return Server(data_dir, proc, url, token, log_path, home)
        except (OSError, ValueError, KeyError):
            time.sleep(0.05)
    proc.kill()
    raise RuntimeError("rigd serve did not write server.json in time")


def reap(data_dir: Path) -> list[int]:
    """Kill (by pid) every QEMU still running for this data directory."""
    leaked = qemu_pids_for(str(data_dir))
    for pid in leaked:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return leaked


@contextlib.contextmanager
def serving(data_dir: Path, *extra: str, keep: bool = False) -> Iterator[Server]:
    """A server on ``data_dir`` for the block; then it is stopped, every QEMU
    naming the directory is killed by pid (a leak fails the test), and the
    directory is removed (unless ``keep``: a :func:`reused_data_dir`). A
    failure prints the server's log."""
    srv = start_server(data_dir, *extra)
    failed = False
    try:
        yield srv
    except BaseException:
        failed = True
        raise
    finally:
        srv.stop()
        leaked = reap(data_dir)
        if failed or leaked:
            sys.stderr.write(srv.log()[-8000:])
        if not keep:
            remove_tree(data_dir)
        assert not leaked, f"QEMU processes outlived the server: {leaked}"


@pytest.fixture
def server() -> Iterator[Server]:
    """A fresh server for the test (modules that can share one override this with
    :func:`shared_server`, and name ``fresh_server`` where a test needs its own)."""
    with serving(make_data_dir()) as srv:
        yield srv


@pytest.fixture
def fresh_server() -> Iterator[Server]:
    with serving(make_data_dir()) as srv:
        yield srv


# -- the shared terminal server -----------------------------------------------------------------


class SharedServer:
    """One ``rigd serve`` for every test of a worker that needs *a* server, not a fresh
    one (a fresh server costs a start-up, a bootstrap and a QEMU probe). A server a test
    left dead is replaced by a new one before the next test, saying so."""

    def __init__(self, *extra: str) -> None:
        self.extra = extra
        self.srv: Server | None = None
        self.stack = contextlib.ExitStack()

    def get(self, nodeid: str = "") -> Server:
        if self.srv is not None and self.srv.proc.poll() is None:
            return self.srv
        if self.srv is not None:
            what = (f"the shared server ({self.srv.data_dir}) exited ({self.srv.proc.returncode}) "
                    f"before {nodeid or 'a test'}: started a new one")
            print(what)
            log.warning("%s", what)
            _REOPENED.append(what)
        self.srv = self.stack.enter_context(serving(make_data_dir(), *self.extra))
        return self.srv

    def close(self) -> None:
        self.stack.close()


def open_rig_ids(srv: Server) -> set[str]:
    """Every rig not closed in the admin's workspaces."""
    return {r["id"] for ws in srv.call("workspace.list") for r in srv.call("rig.list", {"workspace": ws["id"]})
            if r["phase"] != "closed"}


@pytest.fixture(scope="session")
def shared_servers() -> Iterator[SharedServer]:
    shared = SharedServer()
    try:
        yield shared
    finally:
        shared.close()


@pytest.fixture
def shared_server(shared_servers: SharedServer, request: pytest.FixtureRequest) -> Iterator[Server]:
    """The worker's shared server; the rigs a test opens on it are closed when it ends
    (its users, workspaces and audit rows stay: tests name theirs uniquely)."""
    srv = shared_servers.get(request.node.nodeid)
    before = open_rig_ids(srv)
    yield srv
    if srv.proc.poll() is None:
        for rig_id in open_rig_ids(srv) - before:
            with contextlib.suppress(ClientError):
                srv.call("rig.close", {"rigId": rig_id})


# -- the shared desktop -------------------------------------------------------------------------

#: The shared desktop server's data directory. It outlives the run (like SHARED_PACKS): the
#: desktop image is imported once per build and its warm-start snapshot built once per image,
#: tools disk and QEMU, so a run with a warm cache restores desktops (seconds) instead of
#: booting them cold and snapshotting them again (minutes).
DESKTOP_DATA = Path(os.environ.get("RIGD_TEST_DESKTOP_DATA", "/var/tmp/rigd-test-desktop"))
#: The shape every shared desktop has: the product's default (RIGS.md limits), so one
#: snapshot serves the API's rigs and the ones the settings page opens.
DESKTOP_SHAPE: dict[str, Any] = {}


@pytest.fixture(scope="session")
def desktop_server() -> Iterator[Server]:
    """One server for every test that needs a desktop rig (tests/conftest.py runs them all
    on one worker). Its data directory keeps the imported image and its snapshot between
    runs; a second run that finds the directory in use (its lock held) gets a fresh one
    and pays the cold boot. Before it is handed out, the desktop shape has a snapshot:
    the first open of a cold cache boots a seed rig and waits for the snapshot the server
    builds from it, so every test opens warm."""
    from rigd.images.cache import sha256_file
    from rigd.images.desktop import find_desktop

    built = find_desktop()  # `make images-desktop` (the test target depends on it)
    DESKTOP_DATA.mkdir(mode=0o711, parents=True, exist_ok=True)
    with contextlib.ExitStack() as stack:
        lock = stack.enter_context((DESKTOP_DATA / ".lock").open("a"))
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log.warning("%s is in use by another run: this one boots its desktops cold", DESKTOP_DATA)
            data_dir, keep = make_data_dir(), False
        else:
            keep_image = f"sha256-{sha256_file(built.manifest_path)}"
            data_dir, keep = reused_data_dir(DESKTOP_DATA / "data", keep_image), True
        srv = stack.enter_context(serving(data_dir, keep=keep))
        seed_desktop_snapshot(srv)
        yield srv


def desktop_snapshots(srv: Server) -> list[Path]:
    return list((srv.data_dir / "rigs" / "images").glob("sha256-*/snapshots/*/snapshot.json"))


def seed_desktop_snapshot(srv: Server, deadline_s: float = 600) -> None:
    """Make sure the shared desktop shape has a warm-start snapshot (see :func:`desktop_server`)."""
    if desktop_snapshots(srv):
        return
    t0 = time.monotonic()
    rig = srv.call("rig.open", {"workspace": "default", "surface": "computer", **DESKTOP_SHAPE})
    print(f"seed desktop ready in {time.monotonic() - t0:.1f} s ({rig['boot']})")
    assert rig["phase"] == "ready", rig
    # The first cold boot seeds a snapshot in the background (a second desktop booting
    # for a minute or more on this 2-core host): wait for it, then close the seed.
    deadline = time.monotonic() + deadline_s
    while not desktop_snapshots(srv):
        assert time.monotonic() < deadline, "no desktop snapshot was built:\n" + srv.log()[-3000:]
        time.sleep(2)
    srv.call("rig.close", {"rigId": rig["id"]})
    print(f"desktop snapshot built in {time.monotonic() - t0:.1f} s")


class SharedRig:
    """A rig that a module's tests share (one boot for many tests). Each test asks for it
    with :meth:`healthy`: a rig a test left failed or closed is replaced by a new one, and
    the run says so (in the test's output and in the summary), never silently."""

    def __init__(self, srv: Server, params: dict[str, Any], token: str | None = None) -> None:
        self.srv = srv
        self.params = params
        self.token = token
        self.rig: dict[str, Any] = {}
        self.opened = 0

    @property
    def id(self) -> str:
        return str(self.rig["id"])

    def open(self) -> dict[str, Any]:
        t0 = time.monotonic()
        rig = self.srv.call("rig.open", self.params, token=self.token)
        assert rig["phase"] == "ready", rig
        self.rig = dict(rig)
        self.opened += 1
        print(f"shared {rig['surface']} rig {rig['id']} ready in {time.monotonic() - t0:.1f} s "
              f"({rig.get('boot')})")
        return self.rig

    def healthy(self, nodeid: str = "") -> str:
        """The rig's id, once it is ready or parked (a parked rig wakes at its next action)."""
        got = self.srv.call("rig.get", {"rigId": self.id}, token=self.token)
        if got["phase"] in ("ready", "parked"):
            return self.id
        what = (f"{got['surface']} rig {self.id} was {got['phase']} ({got.get('phaseDetail') or '-'}) "
                f"before {nodeid or 'a test'}: replaced by a new one")
        print(what)
        log.warning("%s", what)
        _REOPENED.append(what)
        with contextlib.suppress(ClientError):
            self.srv.call("rig.close", {"rigId": self.id}, token=self.token)
        return str(self.open()["id"])

    def close(self) -> None:
        if self.rig:
            with contextlib.suppress(ClientError):
                self.srv.call("rig.close", {"rigId": self.id}, token=self.token)


def open_terminal(srv: Server, **params: Any) -> dict[str, Any]:
    rig = srv.call("rig.open", {"workspace": "default", "surface": "terminal", **params})
    assert rig["phase"] == "ready", rig
    return dict(rig)


def exec_(srv: Server, rig_id: str, token: str | None = None, **action: Any) -> dict[str, Any]:
    return dict(srv.call("rig.act", {"rigId": rig_id, "tool": "terminal_use",
                                     "action": {"action": "exec", **action}}, token=token))


def decoded(data: str | bytes) -> Image.Image:
    """An image from a verb's base64 ``data`` or a live frame's bytes, as RGB."""
    raw = base64.b64decode(data) if isinstance(data, str) else data
    with Image.open(io.BytesIO(raw)) as img:
        return img.convert("RGB")


def mark_drawn(img: Image.Image, box: list[int], scale: float = 1.0) -> bool:
    """Whether the left edge of a mark's ``box`` (display px; ``scale`` display px per image px)
    is drawn in a mark's colour (rigd.marks.PALETTE: saturated, where a page is white, a
    button grey and a terminal dark)."""
    x, y = round(box[0] / scale), round((box[1] + box[3] // 2) / scale)
    pixel = img.getpixel((min(img.width - 1, x), min(img.height - 1, y)))
    assert isinstance(pixel, tuple)
    return max(pixel) - min(pixel) > 90


def gateway_refusals(srv: Server, rig_id: str) -> dict[str, int]:
    """How many times the rig's egress gateway refused each host (the audit log's ``netgate``
    rows, every page of them): what a browser engine looked up on its own shows here."""
    counts: dict[str, int] = {}
    after = 0
    while rows := srv.call("rig.log", {"rigId": rig_id, "afterSeq": after}):
        for row in rows:
            after = max(after, int(row["seq"]))
            if row["tool"] == "netgate" and row.get("outcome") == "refused":
                host = str(row["args"].get("host") or row["args"].get("aimed_at") or "?")
                counts[host] = counts.get(host, 0) + 1
    return counts


__all__ = ["DESKTOP_SHAPE", "ClientError", "Server", "SharedRig", "SharedServer", "TestEvidence", "cleanup_failed", "decoded",
           "desktop_server", "exec_", "gateway_refusals", "make_data_dir", "mark_drawn",
           "open_terminal", "qemu_pids_for", "reap", "remove_tree", "server_home", "start_server",
           "track_server"]
