"""Probe whether an accelerator really works, by booting.

``/dev/kvm`` can exist and accept ``KVM_CREATE_VM`` while every 64-bit guest
hangs (broken nested virtualisation; HOST-NOTES.md). So rigd decides by a real
boot: the terminal kernel and initramfs with ``rigd.probe=1``, whose init
prints ``RIGD-PROBE-OK`` and powers off. A probe that does not print it
within the deadline means the accelerator does not work here. The server
never falls back to TCG by itself; ``--accel tcg`` is the operator's choice.
"""

from __future__ import annotations

import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import trio

from rigd.backends.confine import SANDBOX_OPTS, UidPool
from rigd.model import Accel

PROBE_OK = b"RIGD-PROBE-OK"


@dataclass(frozen=True, slots=True)
class ProbeResult:
    accel: Accel
    ok: bool
    seconds: float
    detail: str


def native_accel() -> Accel | None:
    if sys.platform.startswith("linux"):
        return Accel.KVM
    if sys.platform == "darwin":
        return Accel.HVF
    return None


def probe_argv(qemu: str, accel: Accel, kernel: Path, initrd: Path) -> list[str]:
    return [
        qemu, "-M", "microvm", "-accel", accel.value,
        "-cpu", "host" if accel is not Accel.TCG else "max",
        "-m", "128", "-smp", "1", "-nodefaults", "-no-user-config", "-display", "none",
        "-no-reboot", "-serial", "stdio", "-kernel", str(kernel), "-initrd", str(initrd),
        "-append", "console=ttyS0 rigd.probe=1 panic=-1 quiet",
        "-sandbox", SANDBOX_OPTS,
    ]


async def probe(
    accel: Accel, *, qemu: str, kernel: Path, initrd: Path, deadline_s: float = 10.0
) -> ProbeResult:
    """Boot once under ``accel``; kill the probe VM (by pid) whatever happens."""
    pool = UidPool()
    ident = pool.acquire()
    if accel is Accel.KVM:
        kvm = trio.Path("/dev/kvm")
        if not await kvm.exists():
            return ProbeResult(accel, False, 0.0, "/dev/kvm does not exist")
        st = await kvm.stat()
        if ident.per_rig and not (st.st_mode & 0o060 == 0o060 and st.st_gid != 0):
            return ProbeResult(
                accel, False, 0.0,
                f"/dev/kvm is mode {st.st_mode & 0o777:o} owned by gid {st.st_gid}: the "
                "unprivileged per-rig QEMU users cannot open it. Give it a kvm group with "
                "rw access (e.g. `chgrp kvm /dev/kvm && chmod 660 /dev/kvm`, or the usual "
                "udev rule) and probe again",
            )
    started = time.monotonic()
    try:
        proc = await trio.lowlevel.open_process(
            probe_argv(qemu, accel, kernel, initrd), stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
            user=ident.uid if ident.per_rig else None, group=ident.gid if ident.per_rig else None,
            extra_groups=list(ident.extra_groups) if ident.per_rig else None,
        )
    except OSError as exc:
        return ProbeResult(accel, False, 0.0, f"cannot run {qemu}: {exc.strerror}")
    seen = bytearray()
    ok = False
    try:
        assert proc.stdout is not None
        with trio.move_on_after(deadline_s):
            while True:
                chunk = await proc.stdout.receive_some(4096)
                if not chunk:
                    break
                seen += chunk
                if PROBE_OK in seen:
                    ok = True
                    break
                del seen[:-4096]
    finally:
        with trio.CancelScope(shield=True):
            if proc.returncode is None:
                proc.kill()
            await proc.wait()
    took = time.monotonic() - started
    if ok:
        return ProbeResult(accel, True, took, f"booted in {took:.1f} s")
    tail = seen.decode("utf-8", "replace").strip().splitlines()[-3:]
    why = f"no boot within {deadline_s:.0f} s" if took >= deadline_s else "QEMU exited"
    return ProbeResult(accel, False, took, why + (f" (last output: {' | '.join(tail)})" if tail else ""))
