"""TCG's threading, measured (``make bench``): one host thread per vCPU against one per machine.

Raw desktops (the computer image, :func:`rigd.backends.desktop_argv.desktop_argv` under TCG,
``-smp 2``, a thin overlay each) boot to a settled XFCE frame (QMP ``screendump``: many colours
and a second colour beside the backdrop), first alone, then as many at once as the host has
cores, once with ``-accel tcg,thread=multi`` (QEMU's default) and once with
``thread=single``. Printed per case: wall time to XFCE and QEMU's own CPU-seconds
(utime + stime from ``/proc``); then the ratios multi / single, which is what
``default_tcg_threads`` (``rigd serve --tcg-threads auto``) rests on. Every QEMU is killed
by pid on the way out.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

# _common (beside this script) puts this checkout first on sys.path, so it comes before rigd.
from _common import REAPER, BenchError
from PIL import Image

from rigd.backends.desktop_argv import desktop_argv
from rigd.backends.layout import remove_tree
from rigd.images import find_assets
from rigd.images.desktop import DesktopImage, build_desktop

DEADLINE_S = 600.0


@dataclass
class Boot:
    wall_s: float
    cpu_s: float


def settled(frame: Image.Image) -> bool:
    found = frame.convert("RGB").getcolors(maxcolors=1 << 20) or []
    counts = sorted((n for n, _ in found), reverse=True)
    return len(counts) >= 64 and counts[1] / (frame.size[0] * frame.size[1]) >= 0.01


def qmp(path: Path, deadline: float) -> socket.socket:
    while time.monotonic() < deadline:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            s.connect(str(path))
        except OSError:
            s.close()
            time.sleep(0.05)
            continue
        s.settimeout(60)
        f = s.makefile("rb")
        f.readline()  # greeting
        s.sendall(b'{"execute": "qmp_capabilities"}\n')
        f.readline()
        return s
    raise BenchError(f"{path} never accepted")


def command(s: socket.socket, name: str, **args: object) -> None:
    s.sendall(json.dumps({"execute": name, "arguments": args}).encode() + b"\n")
    buf = b""
    while True:
        chunk = s.recv(65536)
        if not chunk:
            raise BenchError("QMP closed")
        buf += chunk
        for line in buf.split(b"\n")[:-1]:
            msg = json.loads(line)
            if "error" in msg:
                raise BenchError(f"QMP {name}: {msg['error']}")
            if "return" in msg:
                return
        buf = buf.rsplit(b"\n", 1)[-1]


def cpu_s(pid: int) -> float:
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rfind(")") + 2:].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def boot(image: DesktopImage, tools: Path, threads: str, vcpus: int) -> Boot:
    run = Path(tempfile.mkdtemp(prefix="rigd-bench-tcg-", dir="/var/tmp"))
    try:
        overlay = run / "disk.qcow2"
        subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", "-F", "qcow2", "-b", str(image.disk),
                        str(overlay)], check=True)
        argv = desktop_argv(qemu="qemu-system-x86_64", accel="tcg", tcg_threads=threads, memory_mb=2048,
                            vcpus=vcpus, disk_overlay=overlay, kernel=image.kernel, initrd=image.initrd,
                            cmdline_extra=image.cmdline, tools_disk=tools, qmp_socket=run / "qmp.sock",
                            agent_socket=run / "agent.sock", console_socket=run / "console.sock",
                            width=image.manifest.width, height=image.manifest.height)
        with (run / "qemu.log").open("wb") as log:
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log)
        REAPER.add(proc.pid, f"qemu ({threads})")
        t0 = time.monotonic()
        try:
            s = qmp(run / "qmp.sock", t0 + 30)
            while True:
                if proc.poll() is not None:
                    said = (run / "qemu.log").read_text()[-800:]
                    raise BenchError(f"QEMU exited ({proc.returncode}): {said}")
                if time.monotonic() - t0 > DEADLINE_S:
                    raise BenchError(f"no XFCE frame within {DEADLINE_S:.0f} s")
                command(s, "screendump", filename=str(run / "frame.ppm"))
                with Image.open(run / "frame.ppm") as frame:
                    if settled(frame):
                        break
                time.sleep(0.5)
            return Boot(time.monotonic() - t0, cpu_s(proc.pid))
        finally:
            proc.kill()
            proc.wait()
            REAPER.discard(proc.pid)
    finally:
        remove_tree(run)


def at_once(image: DesktopImage, tools: Path, threads: str, n: int, vcpus: int) -> list[Boot]:
    out: list[Boot | BaseException] = [BenchError("not run")] * n

    def one(i: int) -> None:
        try:
            out[i] = boot(image, tools, threads, vcpus)
        except BaseException as exc:  # reported below, after every thread ends
            out[i] = exc

    workers = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    for r in out:
        if isinstance(r, BaseException):
            raise r
    return [r for r in out if isinstance(r, Boot)]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--machines", type=int, default=os.cpu_count() or 2,
                   help="machines at once (default: the host's cores)")
    p.add_argument("--vcpus", type=int, default=2)
    args = p.parse_args()
    image = build_desktop(log=lambda m: None)
    tools = find_assets().tools
    cases = [(1, "multi"), (1, "single"), (args.machines, "multi"), (args.machines, "single")]
    results: dict[tuple[int, str], list[Boot]] = {}
    try:
        for n, threads in cases:
            boots = at_once(image, tools, threads, n, args.vcpus)
            results[(n, threads)] = boots
            print(f"{n} at once, thread={threads:6}: " + "  ".join(
                f"XFCE in {b.wall_s:5.1f} s, {b.cpu_s:5.1f} CPU-s" for b in boots), flush=True)
    except BenchError as exc:
        print(f"bench: {exc}", file=sys.stderr)
        return 1
    finally:
        REAPER.kill_all()

    def mean(boots: list[Boot], what: str) -> float:
        return sum(getattr(b, what) for b in boots) / len(boots)

    for n in (1, args.machines):
        multi, single = results[(n, "multi")], results[(n, "single")]
        print(f"{n} at once: multi / single  wall {mean(multi, 'wall_s') / mean(single, 'wall_s'):.2f}x  "
              f"CPU {mean(multi, 'cpu_s') / mean(single, 'cpu_s'):.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
