"""Real-server fixtures: a ``rigd serve`` subprocess under TCG with its own
data directory, and a client for it.

The fixture owns every QEMU its server starts: at teardown it stops the
server (SIGTERM, which closes every rig), then kills by pid any QEMU whose
command line still names its data directory, and fails the test if it had
to. Console output of rigs that failed is printed for the report.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from rigd.backends.desktop_argv import desktop_argv
from rigd.cli import Client, ClientError
from rigd.images.desktop import DesktopImage

REPO = Path(__file__).resolve().parents[2]
#: Packs are expensive (the image unpacked into an ext4 file); tests share one
#: directory of them, outside any private home so rig uids can read them.
SHARED_PACKS = Path(os.environ.get("RIGD_TEST_PACKS", "/var/tmp/rigd-test-packs"))


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
    plain TCG machine booting it (sockets in ``run_dir``), without a server."""
    overlay = run_dir / "disk.qcow2"
    subprocess.run(
        ["qemu-img", "create", "-q", "-f", "qcow2", "-F", "qcow2", "-b", str(image.disk), str(overlay)],
        check=True,
    )
    return desktop_argv(
        qemu="qemu-system-x86_64", accel="tcg", memory_mb=2048, vcpus=2, disk_overlay=overlay,
        kernel=image.kernel, initrd=image.initrd, cmdline_extra=image.cmdline,
        qmp_socket=run_dir / "qmp.sock", agent_socket=run_dir / "agent.sock",
        console_socket=run_dir / "console.sock", width=image.manifest.width,
        height=image.manifest.height,
    )


def make_data_dir() -> Path:
    d = Path(tempfile.mkdtemp(prefix="rigd-test-", dir="/var/tmp"))
    os.chmod(d, 0o711)
    rigs = d / "rigs"
    rigs.mkdir(mode=0o711)
    SHARED_PACKS.mkdir(parents=True, exist_ok=True)
    os.chmod(SHARED_PACKS, 0o711)
    (rigs / "smolvm-packs").symlink_to(SHARED_PACKS)
    return d


def start_server(data_dir: Path, *extra: str) -> Server:
    log_path = data_dir / "server.log"
    (data_dir / "server.json").unlink(missing_ok=True)
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "rigd.cli", "serve", "--data-dir", str(data_dir), "--port", "0",
             "--accel", "tcg", "--log-level", "info", *extra],
            stdout=log, stderr=subprocess.STDOUT, cwd=REPO,
        )
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"rigd serve exited ({proc.returncode}):\n{log_path.read_text()}")
        try:
            url = json.loads((data_dir / "server.json").read_text())["url"]
            token = (data_dir / "admin.token").read_text().strip()
            return Server(data_dir, proc, url, token, log_path)
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
def serving(data_dir: Path, *extra: str) -> Iterator[Server]:
    """A server on ``data_dir`` for the block; then it is stopped, every QEMU
    naming the directory is killed by pid (a leak fails the test), and the
    directory is removed. A failure prints the server's log."""
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
        shutil.rmtree(data_dir, ignore_errors=True)
        assert not leaked, f"QEMU processes outlived the server: {leaked}"


@pytest.fixture
def server() -> Iterator[Server]:
    with serving(make_data_dir()) as srv:
        yield srv


def open_terminal(srv: Server, **params: Any) -> dict[str, Any]:
    rig = srv.call("rig.open", {"workspace": "default", "surface": "terminal", **params})
    assert rig["phase"] == "ready", rig
    return dict(rig)


def exec_(srv: Server, rig_id: str, token: str | None = None, **action: Any) -> dict[str, Any]:
    return dict(srv.call("rig.act", {"rigId": rig_id, "tool": "terminal_use",
                                     "action": {"action": "exec", **action}}, token=token))


__all__ = ["ClientError", "Server", "exec_", "make_data_dir", "open_terminal", "qemu_pids_for",
           "reap", "start_server"]
