"""Terminal rigs (backend ``smolvm``): the boot recipe for QEMU's ``microvm``.

A terminal rig boots the pinned OCI image, unpacked once into a pack
(``<dataDir>/rigs/smolvm-packs/<digest>-tools-v1/rootfs.img``; phase
``unpacking image``, later ``checking image``), by PVH from the cloud kernel
and our initramfs, with the read-only tools disk carrying the agent. QEMU
starts confined (see :mod:`rigd.backends.confine`) with QMP, the serial
console and the agent channel on Unix sockets in
``<dataDir>/rigs/smolvm/<rigId>/``; the host says ``hello`` until the agent
answers (it also sets the guest clock), then ``reseed``: the rig's own
``/etc/machine-id``, fresh entropy, its MAC.

Everything else — the machine, warm starts, gates, teardown — is the QEMU
backend's (:mod:`rigd.backends.host`); this module is the recipe only. A
terminal has no screen: its driver is :class:`rigd.backends.recipe.NoScreen`.
``RIGD_WARM_STARTS=0`` (or ``QemuConfig.warm_starts=False``) turns warm starts off.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import trio

from rigd.backends.base import MachineSpec
from rigd.backends.confine import UidPool
from rigd.backends.gates import NetworkConfig, net_argv
from rigd.backends.host import QemuBackend
from rigd.backends.layout import Layout
from rigd.backends.microvm_argv import microvm_argv
from rigd.backends.qemu import QemuConfig, timeouts_for
from rigd.backends.recipe import PLACEHOLDER_PATHS, Driver, Identity, NoScreen, RigPaths
from rigd.backends.warm import SnapshotService
from rigd.images import TerminalAssets
from rigd.model import Backend, Surface

if TYPE_CHECKING:
    from rigd.backends.qemu import QemuMachine


def rig_argv(
    config: QemuConfig,
    assets: TerminalAssets,
    *,
    memory_mb: int,
    vcpus: int,
    rig_dir: Path,
    overlay: Path,
    mac: str | None,
    incoming: bool = False,
    kernel: Path | None = None,
    initrd: Path | None = None,
    tools: Path | None = None,
    tap_fd: int | str | None = None,
    extra_ports: Sequence[tuple[str, Path]] = (),
) -> list[str]:
    """The QEMU command line of a terminal rig (asset paths overridable for the key's placeholders).

    With networking on, the NIC's backend is the gateway's tap, passed by fd
    (``tap_fd``; ``"@fd"`` in a snapshot key), and the guest is told its
    addresses on the kernel command line (``rigd.net=``, read by the tools
    disk's init). In user mode the NIC is slirp (``restrict=on``) whose
    guestfwd helpers hand connections to ``<rig_dir>/net.sock``, and the
    sandbox allows spawn (:data:`netgate.usermode.SANDBOX`).
    """
    net = net_argv(config.network, rig_dir, tap_fd)
    at = RigPaths(rig_dir, overlay)
    return microvm_argv(
        qemu=config.qemu, accel=str(config.accel), memory_mb=memory_mb, vcpus=vcpus,
        kernel=kernel or assets.kernel, initrd=initrd or assets.initrd, root_disk=overlay,
        tools_disk=tools or assets.tools, qmp_socket=at.qmp, agent_socket=at.agent,
        console_socket=at.console,
        mac=mac, incoming="defer" if incoming else None, extra_ports=extra_ports, **net,
    )


@dataclass(frozen=True, slots=True)
class TerminalRecipe:
    """Terminal machines booting one pack."""

    config: QemuConfig
    assets: TerminalAssets
    #: The pack's rootfs.img (raw ext4), every overlay's backing file.
    backing: Path
    surface: Surface = Surface.TERMINAL
    backing_format: str = "raw"

    def identity(self, spec: MachineSpec) -> Identity:
        return Identity(Backend.SMOLVM, self.config.accel, self.assets.image_digest)

    def boot_deadline_s(self, spec: MachineSpec) -> float:
        return timeouts_for(self.config.accel)[0]

    def argv(self, spec: MachineSpec, at: RigPaths, *, mac: str | None, incoming: bool,
             tap_fd: int | str | None) -> list[str]:
        return rig_argv(self.config, self.assets, memory_mb=spec.memory_mb, vcpus=spec.vcpus,
                        rig_dir=at.rig_dir, overlay=at.overlay, mac=mac, incoming=incoming,
                        tap_fd=tap_fd)

    def warm_eligible(self, spec: MachineSpec) -> bool:
        return True

    def warm_shape(self, spec: MachineSpec) -> tuple[list[str], dict[str, Any]]:
        assets = self.assets
        at = PLACEHOLDER_PATHS
        shape = rig_argv(
            self.config, assets, memory_mb=spec.memory_mb, vcpus=spec.vcpus, rig_dir=at.rig_dir,
            overlay=at.overlay, mac=None if self.config.network is None else "02:00:00:00:00:00",
            kernel=Path("/@kernel"), initrd=Path("/@initrd"), tools=Path("/@tools"), tap_fd="@fd",
        )
        return shape, {
            name: {"key": path.parent.name, "file": path.name, "size": path.stat().st_size}
            for name, path in (("kernel", assets.kernel), ("initrd", assets.initrd),
                               ("tools", assets.tools))
        }

    def driver(self, machine: QemuMachine) -> Driver:
        return NoScreen(self.surface)


class TerminalImages:
    """The recipe source of terminal rigs: the pack, unpacked once (under a lock)."""

    def __init__(self, config: QemuConfig, assets: TerminalAssets,
                 ensure_pack: Callable[[Callable[[str], None]], Path]) -> None:
        self.config = config
        self.assets = assets
        self._ensure_pack = ensure_pack
        self._lock = trio.Lock()

    async def pack(self, progress: Callable[[str], None]) -> Path:
        async with self._lock:
            return await trio.to_thread.run_sync(self._ensure_pack, progress)

    async def recipe(self, spec: MachineSpec, progress: Callable[[str], None]) -> TerminalRecipe:
        return TerminalRecipe(self.config, self.assets, await self.pack(progress))


def terminal_backend(
    config: QemuConfig, assets: TerminalAssets, ensure_pack: Callable[[Callable[[str], None]], Path], *,
    layout: Layout | None = None, uids: UidPool | None = None, snapshots: SnapshotService | None = None,
) -> QemuBackend:
    return QemuBackend(Backend.SMOLVM, config, TerminalImages(config, assets, ensure_pack),
                       layout=layout, uids=uids, snapshots=snapshots)


async def prepare_terminals(backend: QemuBackend, memory_mb: int, vcpus: int,
                            progress: Callable[[str], None]) -> None:
    """Unpack the pack and make sure the default shape has (or is building) a snapshot."""
    images = backend.recipes
    assert isinstance(images, TerminalImages)
    spec = MachineSpec(rig_id="prepare", surface=Surface.TERMINAL, memory_mb=memory_mb, vcpus=vcpus)
    recipe = await images.recipe(spec, progress)
    await backend.snapshots.ensure(recipe, spec)


__all__ = ["NetworkConfig", "QemuConfig", "TerminalImages", "TerminalRecipe", "prepare_terminals",
           "rig_argv", "terminal_backend"]
