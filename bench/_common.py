"""What the server benches share: the pid reaper, the numbers, and a ``rigd serve`` to talk to.

Imported by ``bench/terminal.py`` and ``bench/lifecycle.py`` as ``_common``
(each is run as a script, so ``bench/`` is on ``sys.path``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from rigd.backends.procs import proc_alive, proc_start_ticks  # noqa: E402
from rigd.backends.snapshot import ENV_SWITCH  # noqa: E402
from rigd.client.cli import Client  # noqa: E402
from rigd.errors import leaves as failure_leaves  # noqa: E402


class BenchError(Exception):
    pass


# --- every process we start, killed by pid ---------------------------------------


@dataclass(slots=True)
class Tracked:
    ticks: int | None
    what: str


class Reaper:
    """Pids (with start times, so a recycled pid is never hit) of everything we started."""

    def __init__(self) -> None:
        self.pids: dict[int, Tracked] = {}
        self.ever: dict[int, Tracked] = {}

    def add(self, pid: int, what: str) -> None:
        tracked = Tracked(proc_start_ticks(pid), what)
        self.pids[pid] = tracked
        self.ever[pid] = tracked

    def discard(self, pid: int) -> None:
        self.pids.pop(pid, None)

    def ticks(self, pid: int) -> int | None:
        t = self.pids.get(pid)
        return t.ticks if t is not None else None

    def alive(self) -> list[tuple[int, str]]:
        return [(pid, t.what) for pid, t in self.ever.items() if proc_alive(pid, t.ticks)]

    def kill_all(self, wait_s: float = 10.0) -> None:
        for pid, t in list(self.pids.items()):
            if proc_alive(pid, t.ticks):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + wait_s
        for pid, t in list(self.pids.items()):
            with contextlib.suppress(ChildProcessError, OSError):
                os.waitpid(pid, 0)  # our own child: reap it
            while proc_alive(pid, t.ticks) and time.monotonic() < deadline:
                time.sleep(0.05)  # the server's child: nothing to wait on but /proc
            self.discard(pid)


REAPER = Reaper()


def children_of(ppid: int) -> list[int]:
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        with contextlib.suppress(OSError, ValueError, IndexError):
            raw = Path(f"/proc/{entry}/stat").read_bytes()
            if int(raw[raw.rfind(b")") + 2 :].split()[1]) == ppid:
                out.append(int(entry))
    return out


def leaves(exc: BaseException) -> list[BaseException]:
    """The exceptions inside (nested) exception groups, as Trio's nurseries wrap them."""
    return list(failure_leaves(exc))


# --- numbers ---------------------------------------------------------------------


def med(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def fmt_s(x: float) -> str:
    return f"{x:.2f} s"


def fmt_ms(x: float) -> str:
    if x < 0.001:
        return f"{x * 1e6:.0f} µs"
    return f"{x * 1000:.1f} ms" if x < 0.1 else f"{x * 1000:.0f} ms"


def tail(data: bytes | bytearray | str, n: int = 600) -> str:
    text = data if isinstance(data, str) else bytes(data[-n:]).decode("utf-8", "replace")
    return text[-n:].strip()


# --- the server --------------------------------------------------------------------


@dataclass(slots=True)
class Server:
    name: str
    data_dir: Path
    proc: subprocess.Popen[bytes]
    client: Client
    url: str
    log_path: Path
    rig_pids: dict[str, int] = field(default_factory=dict)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


def start_server(args: argparse.Namespace, name: str, data_dir: Path, *, warm: bool,
                 extra: list[str] | None = None) -> Server:
    """``rigd serve`` on ``data_dir`` (log: ``bench-server.log``, appended), warm starts on or off.

    The server is this checkout's code run by this interpreter, so it is the
    rigd the bench imports (a worktree has no ``.venv`` of its own).
    """
    # Pools off unless the bench names some: a background fill would run beside what it times.
    pools = [] if extra and "--pool" in extra else ["--pool", "none"]
    cmd = [sys.executable, "-m", "rigd", "serve", "--data-dir", str(data_dir), "--port", "0",
           "--accel", args.accel, "--qemu", args.qemu, "--log-level", "info", *pools, *(extra or [])]
    path = os.environ.get("PYTHONPATH")
    env = {**os.environ, ENV_SWITCH: "1" if warm else "0",
           "PYTHONPATH": str(REPO) + (os.pathsep + path if path else "")}
    log_path = data_dir / "bench-server.log"
    (data_dir / "server.json").unlink(missing_ok=True)
    with open(log_path, "ab") as logf:
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=logf, stderr=logf,
                                start_new_session=True, env=env, cwd=str(REPO))
    REAPER.add(proc.pid, f"rigd serve ({name})")
    deadline = time.monotonic() + 120
    while not (data_dir / "server.json").exists():
        if proc.poll() is not None:
            raise BenchError(f"rigd serve ({name}) exited ({proc.returncode}): "
                             f"{tail(log_path.read_bytes(), 1500)}")
        if time.monotonic() > deadline:
            raise BenchError(f"rigd serve ({name}) did not write server.json within 120 s")
        time.sleep(0.05)
    url = json.loads((data_dir / "server.json").read_text())["url"]
    token = (data_dir / "admin.token").read_text().strip()
    return Server(name, data_dir, proc, Client(url, token), url, log_path)


def stop_server(srv: Server) -> None:
    """SIGTERM (the server closes its rigs), then SIGKILL; then kill any QEMU it left, by pid."""
    for child in children_of(srv.proc.pid):
        with contextlib.suppress(OSError):
            if Path(f"/proc/{child}/comm").read_text().startswith("qemu"):
                REAPER.add(child, f"qemu of rigd serve ({srv.name})")
    if srv.proc.poll() is None:
        srv.proc.send_signal(signal.SIGTERM)
        try:
            srv.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            print(f"bench: rigd serve ({srv.name}) ignored SIGTERM for 60 s; killing it", file=sys.stderr)
            srv.proc.kill()
            srv.proc.wait()
    REAPER.discard(srv.proc.pid)


def clean_up(srv: Server | None, rc: int, *, server_log: Path, data_dir: Path, keep: bool,
             own_dir: bool = True) -> int:
    """The end of a bench run, whatever happened: stop the server, kill every process left by
    pid, show the server log's tail when the run failed, and remove the data directory (unless
    ``keep``, or it is not the bench's own). Returns ``rc``, 1 if something outlived the clean-up."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # let the clean-up finish
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if srv is not None:
        stop_server(srv)
    REAPER.kill_all()
    left = REAPER.alive()
    if left:
        print(f"bench: processes still alive after clean-up: {left}", file=sys.stderr)
        rc = rc or 1
    if rc != 0 and server_log.exists():
        print(f"bench: server log tail:\n{tail(server_log.read_bytes(), 2000)}", file=sys.stderr)
    if own_dir and not keep:
        shutil.rmtree(data_dir, ignore_errors=True)
    elif own_dir:
        print(f"bench: kept {data_dir}", file=sys.stderr)
    return rc


def add_server_args(p: argparse.ArgumentParser) -> None:
    """The options of a bench that starts its own ``rigd serve``."""
    p.add_argument("--boot-timeout", type=float, default=600.0)
    p.add_argument("--accel", default="tcg", choices=["tcg", "kvm"])
    p.add_argument("--qemu", default="qemu-system-x86_64")
    p.add_argument("--keep", action="store_true")


def scratch_root(name: str) -> Path:
    """A bench's own data directory under /var/tmp (SIGTERM now unwinds into its clean-up)."""
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    root = Path(tempfile.mkdtemp(prefix=f"rigd-bench-{name}-", dir="/var/tmp")).resolve()
    os.chmod(root, 0o711)
    return root
