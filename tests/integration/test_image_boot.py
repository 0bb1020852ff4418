"""Real boots of the terminal assets under TCG (HOST-NOTES: KVM hangs here).

The fixture owns every QEMU it starts and kills it by PID at the end, whatever
happened; a failed test prints the console transcript and keeps it (and
QEMU's stderr) in its test artifacts.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from rigd.backends.microvm_argv import default_tcg_threads, microvm_argv
from rigd.images import TerminalAssets, build_all
from rigd.images.pack import ensure_pack
from tests.integration.conftest import TestEvidence, make_data_dir, remove_tree

pytestmark = [
    pytest.mark.vm,
    pytest.mark.skipif(shutil.which("qemu-system-x86_64") is None, reason="needs QEMU"),
]

QEMU = "qemu-system-x86_64"
READY = b"RIGD-AGENT-READY"
# TCG boots in ~3 s on an idle 2-core host; CI shares its cores, so be generous.
BOOT_DEADLINE = 60.0


@dataclass
class Vm:
    proc: subprocess.Popen[bytes]
    dir: Path
    started: float
    console: bytearray = field(default_factory=bytearray)
    sock: socket.socket | None = None

    def connect_console(self, deadline: float) -> None:
        path = self.dir / "console.sock"
        while time.monotonic() < deadline:
            if path.exists():
                s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                try:
                    s.connect(str(path))
                except OSError:
                    s.close()
                else:
                    self.sock = s
                    return
            if self.proc.poll() is not None:
                raise AssertionError(f"QEMU exited early ({self.proc.returncode})")
            time.sleep(0.005)
        raise AssertionError("console socket never appeared")

    def wait_for(self, marker: bytes, deadline: float) -> float:
        """Seconds from QEMU start until ``marker`` appears on the console."""
        assert self.sock is not None
        while marker not in self.console:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"no {marker.decode()} before the deadline")
            self.sock.settimeout(min(left, 0.5))
            try:
                chunk = self.sock.recv(65536)
            except TimeoutError:
                continue
            if not chunk:
                raise AssertionError(f"console closed (QEMU exited) before {marker.decode()}")
            self.console += chunk
        return time.monotonic() - self.started

    def drain_until_exit(self, deadline: float) -> int:
        assert self.sock is not None
        while self.proc.poll() is None and time.monotonic() < deadline:
            self.sock.settimeout(0.2)
            try:
                chunk = self.sock.recv(65536)
            except TimeoutError:
                continue
            if not chunk:
                break
            self.console += chunk
        left = max(deadline - time.monotonic(), 0.1)
        return self.proc.wait(timeout=left)


Boot = Callable[..., Vm]


@pytest.fixture(scope="session")
def assets() -> TerminalAssets:
    # A cold cache builds everything (about a minute); a warm one only hashes.
    return build_all(log=lambda m: print(f"[images] {m}"))


@pytest.fixture(scope="session")
def rootfs(assets: TerminalAssets) -> Iterator[Path]:
    """The terminal image's pack, the one the servers of the run share (unpacked once per image,
    not once per run); every boot gets a thin overlay of it."""
    data_dir = make_data_dir()  # its rigs/smolvm-packs is the shared packs directory
    try:
        yield ensure_pack(assets, data_dir, lambda step: print(f"[pack] {step}"))
    finally:
        remove_tree(data_dir)


@pytest.fixture
def boot(assets: TerminalAssets, tmp_path: Path, evidence: TestEvidence) -> Iterator[Boot]:
    vms: list[Vm] = []

    def start(root_image: Path, *, tools: Path | None = None, extra: tuple[str, ...] = ()) -> Vm:
        d = tmp_path / f"vm{len(vms)}"
        d.mkdir()
        overlay = d / "root.qcow2"
        subprocess.run(
            ["qemu-img", "create", "-q", "-f", "qcow2", "-F", "raw", "-b", str(root_image), str(overlay)],
            check=True,
        )
        argv = microvm_argv(
            qemu=QEMU,
            accel="tcg", tcg_threads=default_tcg_threads(),
            memory_mb=512,
            vcpus=2,
            kernel=assets.kernel,
            initrd=assets.initrd,
            root_disk=overlay,
            tools_disk=tools or assets.tools,
            qmp_socket=d / "qmp.sock",
            agent_socket=d / "agent.sock",
            console_socket=d / "console.sock",
            cmdline_extra=extra,
        )
        with (d / "qemu.stderr").open("wb") as err:
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=err, stderr=err)
        vm = Vm(proc, d, time.monotonic())
        vms.append(vm)
        evidence.keep(d / "console.log", f"{d.name}-console.log")
        evidence.keep(d / "qemu.stderr", f"{d.name}-qemu-stderr.log")
        vm.connect_console(time.monotonic() + 10)
        return vm

    yield start

    for vm in vms:
        if vm.proc.poll() is None:
            vm.proc.kill()  # by PID: Popen.kill signals exactly this process
        vm.proc.wait(timeout=10)
        if vm.sock is not None:
            vm.sock.close()
        (vm.dir / "console.log").write_bytes(vm.console)
        # pytest shows this only for a failed test.
        print(f"--- console of {vm.dir.name} (QEMU exit {vm.proc.returncode}) ---")
        print(vm.console.decode(errors="replace"))
        print((vm.dir / "qemu.stderr").read_text(errors="replace"))


@pytest.mark.timeout(900)  # includes a cold build of every asset on the first run
def test_terminal_rig_boots_to_a_ready_agent(boot: Boot, rootfs: Path) -> None:
    vm = boot(rootfs)
    elapsed = vm.wait_for(READY, time.monotonic() + BOOT_DEADLINE)
    print(f"QEMU start to {READY.decode()}: {elapsed:.2f} s")
    assert b"RIGD-BOOT-FAIL" not in vm.console
    assert vm.proc.poll() is None  # the agent keeps running as PID 1


@pytest.mark.timeout(120)
def test_probe_boot_says_ok_and_powers_off(boot: Boot, tmp_path: Path) -> None:
    # The probe needs no root disk content: it answers before touching disks.
    blank = tmp_path / "blank.raw"
    blank.write_bytes(b"")
    with blank.open("r+b") as f:
        f.truncate(1 << 20)
    vm = boot(blank, extra=("rigd.probe=1",))
    elapsed = vm.wait_for(b"RIGD-PROBE-OK", time.monotonic() + BOOT_DEADLINE)
    rc = vm.drain_until_exit(time.monotonic() + 30)
    print(f"probe: OK after {elapsed:.2f} s, QEMU exited {rc}")
    assert rc == 0


@pytest.mark.timeout(120)
def test_agent_runs_in_a_root_without_libc(boot: Boot, tmp_path: Path) -> None:
    # An image with no python and no libc at all: the agent must still come up
    # from the tools disk alone.
    tree = tmp_path / "bare"
    for d in ("etc", "root", "tmp"):
        (tree / d).mkdir(parents=True)
    image = tmp_path / "bare.img"
    with image.open("wb") as f:
        f.truncate(64 << 20)
    subprocess.run(["mke2fs", "-q", "-F", "-t", "ext4", "-d", str(tree), str(image)], check=True)
    vm = boot(image)
    vm.wait_for(READY, time.monotonic() + BOOT_DEADLINE)
    assert not (tree / "lib").exists()


@pytest.mark.timeout(120)
def test_missing_tools_disk_fails_fast(boot: Boot, rootfs: Path, tmp_path: Path) -> None:
    # A tools disk that is not ext4: stage 1 must say why and power off, so
    # the host does not wait for a deadline.
    junk = tmp_path / "junk.raw"
    with junk.open("wb") as f:
        f.truncate(1 << 20)
    vm = boot(rootfs, tools=junk)
    vm.wait_for(b"RIGD-BOOT-FAIL: mount tools disk", time.monotonic() + BOOT_DEADLINE)
    assert vm.drain_until_exit(time.monotonic() + 30) == 0
