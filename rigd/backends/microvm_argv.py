"""The QEMU command line of a terminal rig (pure: builds a list, starts nothing).

Used by the microVM backend and by the benchmark's raw-QEMU peer, so both
boot exactly the same machine.

Why it looks like this (measured facts in HOST-NOTES, choices in
docs/images.md):

- ``-M microvm`` boots the ELF ``vmlinux`` by PVH: no firmware, no real-mode
  setup, no in-guest decompression. ``x-option-roms=off`` skips the option
  ROM scan, ``pit``/``pic`` are kept because the kernel calibrates against the
  PIT, and ``rtc=on`` gives the guest wall-clock time at boot.
- All devices are virtio-mmio (``*-device`` variants): the root disk is
  ``vda`` (qcow2 overlay, rw) and the tools disk ``vdb`` (raw, read-only); the
  initramfs relies on that order. A ``q35`` variant uses the ``-pci`` devices
  with the same order.
- ``tsc_early_khz`` stops the 1-in-6 "Unable to calibrate against PIT" hangs of
  microvm; virtio-rng stops Python's start-up waiting for entropy.
- ``tsc=reliable`` keeps the TSC as the guest's clocksource: under TCG the
  kernel's boot-time sync check calls two vCPUs' TSCs "unsynchronized" and
  falls back to jiffies, a clock that loses every tick a busy host delays
  (measured: 2-3 % slow beside two busy cores, so a rig's clock drifted
  seconds from the host's after hello set it). The TSC under TCG and KVM is
  the host's invariant TSC at the rate ``tsc_early_khz`` names.
- The balloon reports freed pages so a parked rig hands RAM back to the host.
- Every socket is a server QEMU creates with ``wait=off``: QEMU never blocks
  on the host, and the host connects when it wants.
- A network device only when the caller passes one (``netdev`` +
  ``nic_netdev``: the egress gateway's tap, or restricted user networking).
  The rig's MAC is a parameter (``mac``, derived from the rig id by
  :func:`rigd.backends.snapshot.rig_mac`): with ``nic_netdev`` set, the NIC
  gets it, so every rig — cold or restored from a snapshot — has its own.
- ``incoming="defer"`` starts the machine waiting for a migration stream
  (a warm start from a snapshot, :mod:`rigd.backends.snapshot`): the same
  command line as the snapshotted machine apart from paths and the MAC.
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Sequence
from pathlib import Path

from rigd.errors import RigdError

SANDBOX = "on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny"

#: Name of the virtio-serial port the guest agent opens (/dev/virtio-ports/rigd.agent).
AGENT_PORT_NAME = "rigd.agent"
#: A terminal rig's port multiplexer (guest-agent/rigd_agent/mux.py, docs/ports.md), its rig-dir socket.
PORTS_PORT_NAME = "rigd.ports"
PORTS_SOCKET = "ports.sock"

_ACCELS = ("kvm", "hvf", "tcg")
_MAC = re.compile(r"^[0-9a-f]{2}(:[0-9a-f]{2}){5}$")
_MACHINES = ("microvm", "q35")


@functools.cache
def host_tsc_khz() -> int | None:
    """The host's TSC frequency in kHz (None when it cannot be read).

    Under TCG and KVM the guest TSC runs at the host's rate, so telling the
    guest kernel spares it the PIT calibration that hangs microvm boots.
    """
    try:
        return int(Path("/sys/devices/system/cpu/cpu0/tsc_freq_khz").read_text().strip())
    except (OSError, ValueError):
        pass
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("cpu MHz"):
                return round(float(line.split(":", 1)[1]) * 1000)
    except (OSError, ValueError):
        pass
    return None


def esc(value: str | Path) -> str:
    """Escape a value for QEMU's option syntax (a comma is doubled)."""
    return str(value).replace(",", ",,")


def check_machine(*, accel: str, memory_mb: int, vcpus: int, min_memory_mb: int,
                  mac: str | None = None) -> None:
    """The checks every rig machine's argv makes (errors name the argument)."""
    if accel not in _ACCELS:
        raise RigdError(f"accel {accel!r} is not one of {', '.join(_ACCELS)}", field="accel")
    if not min_memory_mb <= memory_mb <= 1 << 20:
        raise RigdError(f"memory_mb {memory_mb} is out of range ({min_memory_mb}..1048576)",
                        field="memory_mb")
    if not 1 <= vcpus <= 64:
        raise RigdError(f"vcpus {vcpus} is out of range (1..64)", field="vcpus")
    if mac is not None and not _MAC.match(mac):
        raise RigdError(f"mac {mac!r} is not six lower-case hex pairs", field="mac")
    if mac is not None and int(mac[:2], 16) & 1:
        raise RigdError(f"mac {mac!r} is a multicast address", field="mac")


#: TCG's vCPU threading (``-accel tcg,thread=…``): one host thread per vCPU ("multi", QEMU's
#: default where the host allows it) or one host thread taking every vCPU of the machine in
#: turn ("single").
TCG_THREADS = ("single", "multi")


def default_tcg_threads(cores: int | None = None) -> str:
    """"single" on a host of fewer than four cores, else "multi" (``rigd serve --tcg-threads``).

    Measured on a 2-core host (docs/decisions.md): two desktops booting at once to XFCE took
    77 s and 76 CPU-seconds each with a thread per vCPU, 56 s and 55 CPU-seconds with one
    thread each — a machine's vCPU threads wait on each other whenever the other machine holds
    a core. A lone desktop is faster multi-threaded (34 s against 55 s), which a host with
    cores to spare gets."""
    n = cores if cores is not None else (os.cpu_count() or 1)
    return "single" if n < 4 else "multi"


def accel_arg(accel: str, tcg_threads: str | None) -> str:
    """``-accel``'s value: the accelerator, and under TCG its threading when one is named."""
    if tcg_threads is None or accel != "tcg":
        return accel
    if tcg_threads not in TCG_THREADS:
        raise RigdError(f"tcg_threads {tcg_threads!r} is not one of {', '.join(TCG_THREADS)}",
                        field="tcg_threads")
    return f"tcg,thread={tcg_threads}"


def machine_head(*, qemu: str, machine: str, accel: str, memory_mb: int, vcpus: int,
                 tcg_threads: str | None = None) -> list[str]:
    """The start every rig machine's argv shares: the machine, CPU, memory,
    and nothing QEMU would add by default (no devices, no display, no reboot)."""
    return [
        qemu, "-name", "rig,debug-threads=on", "-M", machine, "-accel", accel_arg(accel, tcg_threads),
        "-cpu", "max" if accel == "tcg" else "host", "-m", str(memory_mb), "-smp", str(vcpus),
        "-nodefaults", "-no-user-config", "-display", "none", "-no-reboot",
    ]


def kernel_cmdline(*, tsc_khz: int | None, extra: Sequence[str] = (), pci: bool = False) -> str:
    args = [
        "console=ttyS0",
        "panic=-1",  # reboot at once on panic; -no-reboot turns that into QEMU exiting
        "quiet",
        "loglevel=4",  # keep warnings and errors on the console, drop the chatter
        "reboot=t",  # triple-fault reboot: no keyboard controller on microvm
        "i8042.noaux",
        "i8042.nokbd",
        "i8042.nopnp",
    ]
    if not pci:
        args.append("pci=off")  # microvm has no PCI bus: skip probing for one
    if tsc_khz:
        args.append(f"tsc_early_khz={tsc_khz}")
        args.append("tsc=reliable")
    for a in extra:
        if not a or any(c.isspace() for c in a):
            raise RigdError(f"kernel command line argument {a!r} is empty or contains whitespace")
        args.append(a)
    return " ".join(args)


def monitor_and_console(qmp_socket: Path, console_socket: Path) -> list[str]:
    """QMP and the serial console (ttyS0: boot markers, ``RIGD-AGENT-READY``) on
    Unix sockets QEMU listens on: the same for every machine rigd starts."""
    return [
        "-chardev", f"socket,id=qmp,path={esc(qmp_socket)},server=on,wait=off",
        "-mon", "chardev=qmp,mode=control",
        "-chardev", f"socket,id=console,path={esc(console_socket)},server=on,wait=off",
        "-serial", "chardev:console",
    ]


_PORT_NAME = re.compile(r"^[a-z][a-z0-9.-]{0,30}$")


def serial_ports(ports: Sequence[tuple[str, Path]]) -> list[str]:
    """A chardev socket (QEMU listens, never waits) and a virtserialport per ``(name, socket)``."""
    out: list[str] = []
    for i, (name, socket) in enumerate(ports):
        if not _PORT_NAME.match(name) or name == AGENT_PORT_NAME:
            raise RigdError(f"virtio-serial port name {name!r} is not a plain lower-case name",
                            field="extra_ports")
        out += ["-chardev", f"socket,id=port{i},path={esc(socket)},server=on,wait=off",
                "-device", f"virtserialport,chardev=port{i},name={name}"]
    return out


def microvm_argv(
    *,
    qemu: str,
    accel: str,
    memory_mb: int,
    vcpus: int,
    kernel: Path,
    initrd: Path,
    root_disk: Path,
    tools_disk: Path,
    qmp_socket: Path,
    agent_socket: Path,
    console_socket: Path,
    cmdline_extra: Sequence[str] = (),
    sandbox: bool = True,
    machine: str = "microvm",
    tsc_khz: int | None = -1,
    mac: str | None = None,
    nic_netdev: str | None = None,
    incoming: str | None = None,
    netdev: str | None = None,
    sandbox_opts: str = SANDBOX,
    extra_ports: Sequence[tuple[str, Path]] = (),
    tcg_threads: str | None = None,
) -> list[str]:
    """Return the argv (``argv[0] == qemu``) that boots one terminal rig.

    ``tsc_khz`` defaults to the host's value (:func:`host_tsc_khz`); pass an
    int to fix it (tests) or ``None`` to leave it out. ``mac`` (lower-case,
    ``02:…`` style) is the rig's own; it reaches a ``virtio-net`` device only
    when ``nic_netdev`` names a ``-netdev`` the caller adds. ``incoming``
    (``"defer"``) makes QEMU wait for ``migrate-incoming`` on QMP. ``netdev``
    is a ``-netdev`` value added verbatim (the egress gateway's tap, by fd,
    or user-mode networking). ``sandbox_opts`` is the ``-sandbox`` value
    (user-mode networking needs spawn allowed: :mod:`netgate.usermode`).
    ``extra_ports`` are more virtio-serial ports after the agent's, each a
    ``(name, socket)`` QEMU listens on (a browser's DevTools relay); without
    them the command line is exactly a terminal's (its warm-start key with it).
    ``tcg_threads`` (:data:`TCG_THREADS`) sets TCG's threading; None leaves QEMU's default.
    """
    if machine not in _MACHINES:
        raise RigdError(f"machine {machine!r} is not one of {', '.join(_MACHINES)}", field="machine")
    check_machine(accel=accel, memory_mb=memory_mb, vcpus=vcpus, min_memory_mb=64, mac=mac)
    if nic_netdev is not None and mac is None:
        raise RigdError("a NIC needs the rig's mac", field="mac")
    if incoming is not None and incoming != "defer":
        raise RigdError(f"incoming {incoming!r} is not 'defer'", field="incoming")
    khz = host_tsc_khz() if tsc_khz == -1 else tsc_khz

    micro = machine == "microvm"
    if micro:
        # PIT and PIC stay on: the cloud kernel calibrates against the PIT.
        mach = "microvm,x-option-roms=off,isa-serial=on,rtc=on,acpi=on,pcie=off"
        bus = "device"
    else:
        mach = "q35,smbus=off,sata=off,usb=off,graphics=off"
        bus = "pci"

    argv = [
        *machine_head(qemu=qemu, machine=mach, accel=accel, memory_mb=memory_mb, vcpus=vcpus,
                      tcg_threads=tcg_threads),
        "-kernel",
        str(kernel),
        "-initrd",
        str(initrd),
        "-append",
        kernel_cmdline(tsc_khz=khz, extra=cmdline_extra, pci=not micro),
        *monitor_and_console(qmp_socket, console_socket),
        # Disks: the order makes them vda (root) and vdb (tools).
        "-drive",
        f"id=root,file={esc(root_disk)},format=qcow2,if=none,discard=unmap",
        "-device",
        f"virtio-blk-{bus},drive=root",
        "-drive",
        f"id=tools,file={esc(tools_disk)},format=raw,if=none,readonly=on",
        "-device",
        f"virtio-blk-{bus},drive=tools",
        # Guest agent channel
        "-chardev",
        f"socket,id=agent,path={esc(agent_socket)},server=on,wait=off",
        "-device",
        f"virtio-serial-{bus},max_ports={2 + len(extra_ports)}",
        "-device",
        f"virtserialport,chardev=agent,name={AGENT_PORT_NAME}",
        *serial_ports(extra_ports),
        # The default backend (rng-builtin) needs no host file.
        "-device",
        f"virtio-rng-{bus}",
        "-device",
        f"virtio-balloon-{bus},free-page-reporting=on",
    ]
    if netdev is not None:
        # The backend (e.g. "tap,id=net0,fd=3,vhost=off", or "user,…,restrict=on") is
        # the caller's: a tap is made by the egress gateway (netgate), never by QEMU.
        argv += ["-netdev", netdev]
    if nic_netdev is not None:
        argv += ["-device", f"virtio-net-{bus},netdev={esc(nic_netdev)},mac={mac}"]
    if incoming is not None:
        argv += ["-incoming", incoming]
    if sandbox:
        argv += ["-sandbox", sandbox_opts]
    return argv


#: The first ``-add-fd`` set of a rig's volumes (sets are per QEMU process).
VOLUME_FDSET = 10


def volume_serial(index: int) -> str:
    """The virtio-blk serial the guest finds volume ``index`` by (``/sys/block/vd*/serial``)."""
    return f"rigd-vol{index}"


def volume_argv(read_only: Sequence[bool], fds: Sequence[Sequence[int]], *, bus: str = "device") -> list[str]:
    """Volumes as virtio-blk disks backed by fds the host opened and passes (``-add-fd``):
    QEMU never opens a volume by path (their directory is root's only). A writer's set holds
    a read-write and a read-only fd (QEMU opens the image read-only first, and an fd set
    answers only an open of its own access mode)."""
    out: list[str] = []
    for i, (ro, group) in enumerate(zip(read_only, fds, strict=True)):
        fdset = VOLUME_FDSET + i
        for j, fd in enumerate(group):
            out += ["-add-fd", f"fd={fd},set={fdset},opaque=volume{i}.{j}"]
        out += ["-drive", f"id=vol{i},file=/dev/fdset/{fdset},format=raw,if=none,"
                          f"readonly={'on' if ro else 'off'},discard=unmap",
                "-device", f"virtio-blk-{bus},drive=vol{i},serial={volume_serial(i)}"]
    return out
