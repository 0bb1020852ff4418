"""What the agent does to the machine itself: seed the kernel RNG, write the machine id, set a
MAC, power off; outside a real PID 1, become the subreaper; the pidfile.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import socket
import struct
import subprocess
import time
from typing import Any

from rigd_agent.base import (
    ARPHRD_ETHER,
    BUSYBOX,
    MACHINE_ID_FILES,
    PR_SET_CHILD_SUBREAPER,
    RB_POWER_OFF,
    RNDADDENTROPY,
    RNDRESEEDCRNG,
    SIOCSIFHWADDR,
    clean_env,
    describe_oserror,
    log,
)


def seed_rng(data: bytes) -> dict[str, Any]:
    """Credit host entropy to the kernel pool and force the CRNG to reseed.

    A restored snapshot carries its RNG state: without this, clones would
    draw the same "random" numbers until the kernel reseeds on its own.
    """
    out: dict[str, Any] = {}
    try:
        fd = os.open("/dev/urandom", os.O_WRONLY | os.O_CLOEXEC)
    except OSError as exc:
        return {"rngError": describe_oserror(exc)}
    try:
        try:
            # struct rand_pool_info { int entropy_count; int buf_size; __u32 buf[]; }
            fcntl.ioctl(fd, RNDADDENTROPY, struct.pack("ii", len(data) * 8, len(data)) + data)
            out["entropyCredited"] = True
        except OSError as exc:
            os.write(fd, data)  # mixed in, at least, though not credited
            out["rngError"] = describe_oserror(exc, "RNDADDENTROPY")
        try:
            fcntl.ioctl(fd, RNDRESEEDCRNG)
            out["crngReseeded"] = True
        except OSError as exc:
            out["rngError"] = describe_oserror(exc, "RNDRESEEDCRNG")
    finally:
        os.close(fd)
    return out


def write_machine_id(sysroot: str, machine_id: str) -> dict[str, Any]:
    """Write ``/etc/machine-id`` (and dbus's copy when it is a file of its own)."""
    written: list[str] = []
    errors: list[str] = []
    for rel in MACHINE_ID_FILES:
        path = os.path.join(sysroot, rel)
        optional = rel != MACHINE_ID_FILES[0]
        if os.path.islink(path) or (optional and not os.path.exists(path)):
            continue  # e.g. dbus's link to /etc/machine-id, or no dbus at all
        if not os.path.isdir(os.path.dirname(path)):
            continue
        tmp = f"{path}.rigd-{os.getpid()}"
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o444)
            try:
                os.write(fd, (machine_id + "\n").encode())
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, path)
            written.append("/" + rel)
        except OSError as exc:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            errors.append(describe_oserror(exc, "/" + rel))
    out: dict[str, Any] = {"machineIdFiles": written}
    if errors:
        out["machineIdError"] = "; ".join(errors)
    return out


def set_mac(mac: str) -> dict[str, Any]:
    """Give the first virtio NIC the rig's MAC (its device state came from the snapshot)."""
    try:
        names = sorted(os.listdir("/sys/class/net"))
    except OSError:
        return {"macSet": []}
    for name in names:
        try:
            driver = os.path.basename(os.readlink(f"/sys/class/net/{name}/device/driver"))
        except OSError:
            continue
        if driver != "virtio_net":
            continue
        ifreq = struct.pack("16sH6s8x", name.encode()[:15], ARPHRD_ETHER, bytes.fromhex(mac.replace(":", "")))
        try:
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
                fcntl.ioctl(s.fileno(), SIOCSIFHWADDR, ifreq)
        except OSError as exc:
            return {"macSet": [], "macError": describe_oserror(exc, name)}
        return {"macSet": [name]}
    return {"macSet": []}


def power_off() -> None:
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.reboot(ctypes.c_int(RB_POWER_OFF))
        log(f"reboot(RB_POWER_OFF) failed: errno {ctypes.get_errno()}")
    except Exception as exc:
        log(f"reboot() via ctypes unavailable: {exc!r}")
    # The syscall needs CAP_SYS_BOOT, which root has in both kinds of image;
    # these are for the odd guest where it is refused anyway. The terminal
    # tools disk has busybox; a desktop image has systemd (and no busybox).
    for argv in ([BUSYBOX, "poweroff", "-f"], ["systemctl", "poweroff", "--force"], ["poweroff", "-f"]):
        if argv[0].startswith("/") and not os.path.exists(argv[0]):
            continue
        with contextlib.suppress(Exception):
            subprocess.run(argv, env=clean_env(), check=False, timeout=30,
                           stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            time.sleep(5)  # a poweroff that was accepted takes the machine down meanwhile
    log("could not power off")


def become_subreaper() -> None:
    """Outside a real PID 1 (tests), adopt orphans so the reaping is still ours."""
    with contextlib.suppress(Exception):
        import ctypes

        ctypes.CDLL(None).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


def write_pidfile(path: str | None, pid: int) -> None:
    if not path:
        return
    try:
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        tmp = f"{path}.tmp"
        with open(tmp, "w") as f:
            f.write(f"{pid}\n")
        os.replace(tmp, path)
    except OSError as exc:
        log(f"cannot write {path}: {exc}")

