"""The terminal rig's QEMU command line (pure)."""

from __future__ import annotations

from pathlib import Path

import pytest

from rigd.backends.microvm_argv import SANDBOX, default_tcg_threads, kernel_cmdline, microvm_argv
from rigd.errors import RigdError


def argv(**kw: object) -> list[str]:
    base: dict[str, object] = dict(
        qemu="/usr/bin/qemu-system-x86_64",
        accel="tcg",
        memory_mb=512,
        vcpus=2,
        kernel=Path("/c/vmlinux"),
        initrd=Path("/c/initrd.img"),
        root_disk=Path("/r/root.qcow2"),
        tools_disk=Path("/c/tools.img"),
        qmp_socket=Path("/r/qmp.sock"),
        agent_socket=Path("/r/agent.sock"),
        console_socket=Path("/r/console.sock"),
        tsc_khz=2596094,
    )
    base.update(kw)
    return microvm_argv(**base)  # type: ignore[arg-type]


def opt(a: list[str], flag: str) -> list[str]:
    return [a[i + 1] for i, x in enumerate(a) if x == flag]


def test_microvm_tcg_shape() -> None:
    a = argv()
    assert a[0] == "/usr/bin/qemu-system-x86_64"
    assert opt(a, "-M")[0].startswith("microvm,")
    assert opt(a, "-accel") == ["tcg"] and opt(a, "-cpu") == ["max"]
    for flag in ("-nodefaults", "-no-user-config", "-no-reboot"):
        assert flag in a
    assert opt(a, "-display") == ["none"]
    assert opt(a, "-kernel") == ["/c/vmlinux"] and opt(a, "-initrd") == ["/c/initrd.img"]
    assert opt(a, "-sandbox") == [SANDBOX]
    assert "-netdev" not in a and not any("virtio-net" in x for x in a)


def test_tcg_threading_is_named_only_under_tcg_and_checked() -> None:
    assert opt(argv(tcg_threads="single"), "-accel") == ["tcg,thread=single"]
    assert opt(argv(tcg_threads="multi"), "-accel") == ["tcg,thread=multi"]
    assert opt(argv(accel="kvm", tcg_threads="single"), "-accel") == ["kvm"]
    with pytest.raises(RigdError) as err:
        argv(tcg_threads="many")
    assert err.value.data["field"] == "tcg_threads" and "single, multi" in str(err.value)


def test_the_default_tcg_threading_is_single_below_four_cores() -> None:
    assert [default_tcg_threads(n) for n in (1, 2, 3, 4, 16)] == ["single"] * 3 + ["multi"] * 2
    assert default_tcg_threads() in ("single", "multi")


def test_disks_are_root_then_read_only_tools() -> None:
    a = argv()
    drives = opt(a, "-drive")
    assert "file=/r/root.qcow2" in drives[0] and "format=qcow2" in drives[0]
    assert "readonly=on" not in drives[0]
    assert "file=/c/tools.img" in drives[1] and "format=raw" in drives[1]
    assert "readonly=on" in drives[1]
    devices = opt(a, "-device")
    blk = [d for d in devices if d.startswith("virtio-blk-device")]
    assert blk == ["virtio-blk-device,drive=root", "virtio-blk-device,drive=tools"]


def test_agent_console_qmp_sockets_never_wait() -> None:
    a = argv()
    chardevs = opt(a, "-chardev")
    for cid, path in (("qmp", "/r/qmp.sock"), ("console", "/r/console.sock"), ("agent", "/r/agent.sock")):
        (c,) = [c for c in chardevs if c.startswith(f"socket,id={cid},")]
        assert f"path={path}" in c and "server=on" in c and "wait=off" in c
    assert opt(a, "-mon") == ["chardev=qmp,mode=control"]
    assert opt(a, "-serial") == ["chardev:console"]
    devices = opt(a, "-device")
    assert "virtserialport,chardev=agent,name=rigd.agent" in devices
    assert any(d.startswith("virtio-serial-device") for d in devices)
    assert "virtio-rng-device" in devices
    assert "virtio-balloon-device,free-page-reporting=on" in devices


def test_kernel_command_line() -> None:
    (cmd,) = opt(argv(cmdline_extra=["rigd.probe=1"]), "-append")
    words = cmd.split()
    assert "console=ttyS0" in words and "panic=-1" in words
    assert "tsc_early_khz=2596094" in words and words[-1] == "rigd.probe=1"
    assert "tsc=reliable" in words  # not jiffies: a clock that loses ticks on a busy host
    assert "tsc_early_khz" not in kernel_cmdline(tsc_khz=None)
    assert "tsc=reliable" not in kernel_cmdline(tsc_khz=None)


def test_kvm_uses_the_host_cpu_and_no_sandbox_can_be_asked() -> None:
    a = argv(accel="kvm", sandbox=False)
    assert opt(a, "-cpu") == ["host"] and "-sandbox" not in a


def test_q35_uses_pci_devices() -> None:
    a = argv(machine="q35")
    assert opt(a, "-M")[0].startswith("q35")
    assert "virtio-blk-pci,drive=root" in opt(a, "-device")


def test_commas_in_paths_are_escaped() -> None:
    a = argv(root_disk=Path("/r/a,b.qcow2"))
    assert "file=/r/a,,b.qcow2," in opt(a, "-drive")[0]


@pytest.mark.parametrize(
    "kw",
    [
        {"accel": "xen"},
        {"machine": "pc"},
        {"memory_mb": 8},
        {"vcpus": 0},
        {"cmdline_extra": ["a b"]},
        {"cmdline_extra": [""]},
    ],
)
def test_bad_arguments_are_refused(kw: dict[str, object]) -> None:
    with pytest.raises(RigdError):
        argv(**kw)
