"""The computer rig's QEMU command line (pure)."""

from __future__ import annotations

from pathlib import Path

import pytest

from rigd.backends.desktop_argv import desktop_argv
from rigd.backends.microvm_argv import SANDBOX
from rigd.errors import RigdError


def argv(**kw: object) -> list[str]:
    base: dict[str, object] = dict(
        qemu="/usr/bin/qemu-system-x86_64",
        accel="tcg",
        memory_mb=2048,
        vcpus=2,
        disk_overlay=Path("/r/disk.qcow2"),
        kernel=Path("/i/vmlinux"),
        initrd=Path("/i/initrd.img"),
        cmdline_extra=("rw", "fsck.mode=skip"),
        qmp_socket=Path("/r/qmp.sock"),
        agent_socket=Path("/r/agent.sock"),
        console_socket=Path("/r/console.sock"),
        tsc_khz=2596094,
    )
    base.update(kw)
    return desktop_argv(**base)  # type: ignore[arg-type]


def opt(a: list[str], flag: str) -> list[str]:
    return [a[i + 1] for i, x in enumerate(a) if x == flag]


def test_q35_tcg_shape() -> None:
    a = argv()
    assert a[0] == "/usr/bin/qemu-system-x86_64"
    (machine,) = opt(a, "-M")
    assert machine.split(",")[0] == "q35"
    # No PS/2: QMP key events can only reach the virtio keyboard.
    assert "i8042=off" in machine.split(",")
    assert opt(a, "-accel") == ["tcg"] and opt(a, "-cpu") == ["max"]
    assert opt(a, "-m") == ["2048"] and opt(a, "-smp") == ["2"]
    for flag in ("-nodefaults", "-no-user-config", "-no-reboot"):
        assert flag in a
    assert opt(a, "-display") == ["none"]
    assert "-vnc" not in a and "-spice" not in a
    assert opt(a, "-kernel") == ["/i/vmlinux"] and opt(a, "-initrd") == ["/i/initrd.img"]
    assert opt(a, "-sandbox") == [SANDBOX]


def test_kvm_uses_the_host_cpu() -> None:
    a = argv(accel="kvm")
    assert opt(a, "-accel") == ["kvm"] and opt(a, "-cpu") == ["host"]
    assert opt(argv(tcg_threads="single"), "-accel") == ["tcg,thread=single"]


def test_no_network_device_at_all() -> None:
    a = argv()
    assert "-netdev" not in a and "-nic" not in a and "-net" not in a
    assert not any("virtio-net" in x or "e1000" in x for x in opt(a, "-device"))


def test_display_at_the_boot_size_with_room_for_larger_modes() -> None:
    devices = opt(argv(), "-device")
    (disp,) = [d for d in devices if d.startswith("bochs-display")]
    props = dict(p.split("=", 1) for p in disp.split(",")[1:])
    assert props["xres"] == "1280" and props["yres"] == "800"
    assert props["edid"] == "on"
    assert (props["xmax"], props["ymax"]) == ("2560", "1600")
    # 2560x1600x4 bytes must fit in VRAM
    assert int(props["vgamem"].rstrip("M")) << 20 >= 2560 * 1600 * 4

    devices = opt(argv(width=1920, height=1080), "-device")
    assert any("xres=1920,yres=1080" in d for d in devices)


def test_virtio_gpu_alternative() -> None:
    devices = opt(argv(display="virtio-gpu"), "-device")
    assert any(d.startswith("virtio-gpu-pci,") and "xres=1280,yres=800" in d for d in devices)
    assert not any(d.startswith("bochs-display") for d in devices)


def test_absolute_pointer_and_keyboard() -> None:
    devices = opt(argv(), "-device")
    assert "virtio-tablet-pci" in devices and "virtio-keyboard-pci" in devices
    assert not any(d.startswith(("virtio-mouse", "usb-mouse")) for d in devices)
    usb = opt(argv(input="usb"), "-device")
    assert {"qemu-xhci", "usb-tablet", "usb-kbd"} <= set(usb)


def test_overlay_agent_port_rng_and_sockets() -> None:
    a = argv()
    (drive,) = opt(a, "-drive")
    assert "file=/r/disk.qcow2" in drive and "format=qcow2" in drive and "readonly" not in drive
    devices = opt(a, "-device")
    assert "virtio-blk-pci,drive=root" in devices
    assert "virtserialport,chardev=agent,name=rigd.agent" in devices
    assert "virtio-rng-pci" in devices
    chardevs = opt(a, "-chardev")
    assert "socket,id=qmp,path=/r/qmp.sock,server=on,wait=off" in chardevs
    assert "socket,id=agent,path=/r/agent.sock,server=on,wait=off" in chardevs
    assert "socket,id=console,path=/r/console.sock,server=on,wait=off" in chardevs
    assert opt(a, "-mon") == ["chardev=qmp,mode=control"]
    assert opt(a, "-serial") == ["chardev:console"]


def test_cmdline_carries_the_image_arguments_and_the_console() -> None:
    (cmdline,) = opt(argv(), "-append")
    words = cmdline.split()
    assert "console=ttyS0" in words and "rw" in words and "fsck.mode=skip" in words
    assert "tsc_early_khz=2596094" in words
    assert "pci=off" not in words  # q35 devices are PCI


def test_commas_in_paths_are_escaped() -> None:
    a = argv(disk_overlay=Path("/r/a,b/disk.qcow2"), qmp_socket=Path("/r/a,b/qmp.sock"))
    assert any("file=/r/a,,b/disk.qcow2," in d for d in opt(a, "-drive"))
    assert any("path=/r/a,,b/qmp.sock," in c for c in opt(a, "-chardev"))


def test_sandbox_can_be_left_out_and_incoming_added() -> None:
    a = argv(sandbox=False, incoming="defer")
    assert "-sandbox" not in a
    assert opt(a, "-incoming") == ["defer"]


@pytest.mark.parametrize(
    ("kw", "field"),
    [
        ({"accel": "xen"}, "accel"),
        ({"memory_mb": 128}, "memory_mb"),
        ({"vcpus": 0}, "vcpus"),
        ({"width": 4096}, "width"),
        ({"height": 100}, "height"),
        ({"display": "cirrus"}, "display"),
        ({"input": "ps2"}, "input"),
        ({"incoming": "tcp:0:1"}, "incoming"),
        ({"cmdline_extra": ("two words",)}, None),
    ],
)
def test_bad_values_are_field_errors(kw: dict[str, object], field: str | None) -> None:
    with pytest.raises(RigdError) as exc:
        argv(**kw)
    if field is not None:
        assert exc.value.data["field"] == field
