"""The QEMU command line of a computer (desktop) rig (pure: builds a list, starts nothing).

Why it looks like this (measured facts in HOST-NOTES "Desktop (computer)
guests", choices and numbers in docs/images.md "Desktop image"):

- ``-M q35`` with the legacy PC parts a rig never uses switched off: no
  SMBus, no SATA, no default USB, **no i8042** (so keyboard events from QMP
  can only reach the virtio keyboard), no vmport.
- Direct kernel boot of the image's own kernel as a PVH ELF (``vmlinux``)
  plus our initramfs, which mounts ``/dev/vda`` and hands over to the
  image's systemd. No firmware menu, no bootloader in the image.
- The display is a ``bochs-display`` (a plain linear framebuffer in a PCI
  BAR, driven by the kernel's ``bochs`` DRM driver and Xorg's modesetting)
  whose EDID prefers the boot size; its VRAM holds modes up to 2560x1600
  for ``set_display``. Under TCG it is cheaper than virtio-gpu, whose every
  damaged rectangle is a virtqueue round trip (measured in docs/images.md);
  ``display="virtio-gpu"`` is kept for comparison. ``-display none``:
  frames come from QMP ``screendump`` or the guest agent, never VNC.
- Absolute input through the hypervisor: a virtio tablet (axes 0-32767)
  and a virtio keyboard (``input="usb"`` gives an xHCI with usb-tablet and
  usb-kbd instead). Both are driven by the guest's libinput.
- The rest is the terminal rig's: the overlay is ``vda`` on virtio-blk,
  the server's read-only tools disk is ``vdb`` (the guest agent lives there,
  not in the image: the initramfs mounts it at ``/.rigd`` when the command
  line says ``rigd.tools=1``),
  the agent's virtio-serial port is ``rigd.agent``, virtio-rng (entropy for
  systemd and Python), a free-page-reporting balloon (parked rigs hand RAM
  back), QMP and the serial console as unix sockets QEMU serves with
  ``wait=off``, and the seccomp sandbox. A NIC only when the caller passes a
  ``netdev`` (the rig's egress gateway; see :mod:`rigd.backends.desktop`).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from rigd.backends.microvm_argv import (
    AGENT_PORT_NAME,
    SANDBOX,
    check_machine,
    esc,
    host_tsc_khz,
    kernel_cmdline,
    machine_head,
    monitor_and_console,
)
from rigd.errors import RigdError

DISPLAYS = ("bochs", "virtio-gpu")
INPUTS = ("virtio", "usb")
#: The largest mode ``set_display`` may ask for (RIGS.md computer_use).
MAX_WIDTH = 2560
MAX_HEIGHT = 1600
#: VRAM for bochs-display: 2560x1600x4 = 15.6 MiB, doubled for the driver's
#: second buffer and rounded to the power of two QEMU wants.
BOCHS_VGAMEM = "32M"


def display_device(display: str, width: int, height: int) -> str:
    if display == "bochs":
        return (
            f"bochs-display,vgamem={BOCHS_VGAMEM},edid=on,xres={width},yres={height},"
            f"xmax={MAX_WIDTH},ymax={MAX_HEIGHT}"
        )
    if display == "virtio-gpu":
        return f"virtio-gpu-pci,max_outputs=1,edid=on,xres={width},yres={height}"
    raise RigdError(f"display {display!r} is not one of {', '.join(DISPLAYS)}", field="display")


def desktop_argv(
    *,
    qemu: str,
    accel: str,
    memory_mb: int,
    vcpus: int,
    disk_overlay: Path,
    kernel: Path,
    initrd: Path,
    cmdline_extra: Sequence[str],
    qmp_socket: Path,
    agent_socket: Path,
    console_socket: Path,
    tools_disk: Path | None = None,
    width: int = 1280,
    height: int = 800,
    sandbox: bool = True,
    display: str = "bochs",
    input: str = "virtio",
    tsc_khz: int | None = -1,
    incoming: str | None = None,
    mac: str | None = None,
    netdev: str | None = None,
    sandbox_opts: str = SANDBOX,
    tcg_threads: str | None = None,
) -> list[str]:
    """Return the argv (``argv[0] == qemu``) that boots one computer rig.

    ``disk_overlay`` is the rig's own qcow2 (backed by the image's
    ``disk.qcow2``); ``tools_disk`` (the server's tools disk: the guest agent)
    becomes the read-only ``vdb`` and ``rigd.tools=1`` tells the initramfs to
    mount it (an image that carries its own agent boots without one);
    ``cmdline_extra`` carries what the image asks for (its manifest's
    ``cmdline``). ``width``/``height`` is the boot mode the display's EDID
    prefers. ``tsc_khz`` defaults to the host's value;
    ``incoming="defer"`` makes QEMU wait for a migration stream (warm start
    from a snapshot). ``netdev`` (a ``-netdev`` value with ``id=net0``: the
    egress gateway's tap by fd, or restricted user networking) adds a
    virtio-net NIC with the rig's ``mac``; ``sandbox_opts`` is the
    ``-sandbox`` value (user networking needs spawn); ``tcg_threads`` as for
    :func:`rigd.backends.microvm_argv.microvm_argv`.
    """
    check_machine(accel=accel, memory_mb=memory_mb, vcpus=vcpus, min_memory_mb=256, mac=mac)
    if not 640 <= width <= MAX_WIDTH:
        raise RigdError(f"width {width} is out of range (640..{MAX_WIDTH})", field="width")
    if not 480 <= height <= MAX_HEIGHT:
        raise RigdError(f"height {height} is out of range (480..{MAX_HEIGHT})", field="height")
    if input not in INPUTS:
        raise RigdError(f"input {input!r} is not one of {', '.join(INPUTS)}", field="input")
    if netdev is not None and mac is None:
        raise RigdError("a NIC needs the rig's MAC", field="mac")
    if incoming is not None and incoming != "defer":
        raise RigdError(f"incoming {incoming!r} is not 'defer'", field="incoming")
    disp = display_device(display, width, height)
    khz = host_tsc_khz() if tsc_khz == -1 else tsc_khz

    argv = [
        *machine_head(qemu=qemu, machine="q35,smbus=off,sata=off,usb=off,i8042=off,vmport=off",
                      accel=accel, memory_mb=memory_mb, vcpus=vcpus, tcg_threads=tcg_threads),
        "-rtc",
        "base=utc",
        "-kernel",
        str(kernel),
        "-initrd",
        str(initrd),
        "-append",
        kernel_cmdline(tsc_khz=khz, extra=[*cmdline_extra, *(["rigd.tools=1"] if tools_disk else [])],
                       pci=True),
        *monitor_and_console(qmp_socket, console_socket),
        # The display at the boot size
        "-device",
        disp,
    ]
    if input == "virtio":
        argv += ["-device", "virtio-tablet-pci", "-device", "virtio-keyboard-pci"]
    else:
        argv += ["-device", "qemu-xhci", "-device", "usb-tablet", "-device", "usb-kbd"]
    argv += [
        # The rig's disk: a thin qcow2 overlay of the image, vda
        "-drive",
        f"id=root,file={esc(disk_overlay)},format=qcow2,if=none,discard=unmap,detect-zeroes=unmap",
        "-device",
        "virtio-blk-pci,drive=root",
    ]
    if tools_disk is not None:
        # After the root, so it is vdb (the order of the devices makes the names).
        argv += ["-drive", f"id=tools,file={esc(tools_disk)},format=raw,if=none,readonly=on",
                 "-device", "virtio-blk-pci,drive=tools"]
    argv += [
        # Guest agent channel
        "-chardev",
        f"socket,id=agent,path={esc(agent_socket)},server=on,wait=off",
        "-device",
        "virtio-serial-pci,max_ports=2",
        "-device",
        f"virtserialport,chardev=agent,name={AGENT_PORT_NAME}",
        "-device",
        "virtio-rng-pci",
        "-device",
        "virtio-balloon-pci,free-page-reporting=on",
    ]
    if netdev is not None:
        argv += ["-netdev", netdev, "-device", f"virtio-net-pci,netdev=net0,mac={mac}"]
    if incoming is not None:
        argv += ["-incoming", incoming]
    if sandbox:
        argv += ["-sandbox", sandbox_opts]
    return argv


__all__ = ["DISPLAYS", "INPUTS", "MAX_HEIGHT", "MAX_WIDTH", "desktop_argv", "display_device"]
