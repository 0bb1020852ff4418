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

A rig whose spec names a custom image (a workspace's ``rigs.smolvm.execImage``)
boots a pack of that registry image instead (pulled on the host first if it is
not in the store: phase ``pulling image``), keyed by its digest and the same
``tools-v1``; the first boot of each such pack checks the terminal image
contract (RIGS.md §3: bash, git, curl, socat) inside the guest and fails the
rig naming what is missing. Custom images boot cold (no memory snapshots).
"""

from __future__ import annotations

import json
import os
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import trio

from rigd.backends.base import MachineSpec
from rigd.backends.confine import UidPool
from rigd.backends.gates import NetworkConfig, net_argv
from rigd.backends.host import QemuBackend
from rigd.backends.layout import Layout
from rigd.backends.microvm_argv import PORTS_PORT_NAME, PORTS_SOCKET, microvm_argv
from rigd.backends.qemu import QemuConfig, timeouts_for
from rigd.backends.recipe import PLACEHOLDER_PATHS, Driver, Identity, NoScreen, RigPaths
from rigd.backends.warm import SnapshotService
from rigd.errors import BackendError
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
        mac=mac, incoming="defer" if incoming else None, extra_ports=extra_ports,
        tcg_threads=config.tcg_threads, **net,
    )


def ports_channel(rig_dir: Path) -> list[tuple[str, Path]]:
    """A terminal's port multiplexer channel (RIGS.md §8; guest-agent/rigd_agent/mux.py)."""
    return [(PORTS_PORT_NAME, rig_dir / PORTS_SOCKET)]


@dataclass(frozen=True, slots=True)
class TerminalRecipe:
    """Terminal machines booting one pack."""

    config: QemuConfig
    assets: TerminalAssets
    #: The pack's rootfs.img (raw ext4), every overlay's backing file.
    backing: Path
    surface: Surface = Surface.TERMINAL
    backing_format: str = "raw"
    volume_bus: str = "device"
    volume_owner: str | None = None
    #: A custom image: its pack (digest, where its contract check is recorded); None: the built-in.
    custom: CustomPack | None = None

    def identity(self, spec: MachineSpec) -> Identity:
        digest = self.custom.digest if self.custom is not None else self.assets.image_digest
        return Identity(Backend.SMOLVM, self.config.accel, digest)

    def boot_deadline_s(self, spec: MachineSpec) -> float:
        return timeouts_for(self.config.accel)[0]

    def argv(self, spec: MachineSpec, at: RigPaths, *, mac: str | None, incoming: bool,
             tap_fd: int | str | None) -> list[str]:
        return rig_argv(self.config, self.assets, memory_mb=spec.memory_mb, vcpus=spec.vcpus,
                        rig_dir=at.rig_dir, overlay=at.overlay, mac=mac, incoming=incoming,
                        tap_fd=tap_fd, extra_ports=ports_channel(at.rig_dir))

    #: A terminal has nothing to start past the agent's hello.
    snapshot_at_hello: bool = True

    def warm_eligible(self, spec: MachineSpec) -> bool:
        # A custom image's snapshot would be keyed by a pack an admin can replace at any
        # time (image.rm, a new tag): custom images boot cold.
        # A volume is one more disk: its rigs boot cold (no snapshot has that device).
        return self.custom is None and not spec.volumes

    def warm_shape(self, spec: MachineSpec) -> tuple[list[str], dict[str, Any]]:
        assets = self.assets
        at = PLACEHOLDER_PATHS
        shape = rig_argv(
            self.config, assets, memory_mb=spec.memory_mb, vcpus=spec.vcpus, rig_dir=at.rig_dir,
            overlay=at.overlay, mac=None if self.config.network is None else "02:00:00:00:00:00",
            kernel=Path("/@kernel"), initrd=Path("/@initrd"), tools=Path("/@tools"), tap_fd="@fd",
            extra_ports=ports_channel(at.rig_dir),
        )
        return shape, {
            name: {"key": path.parent.name, "file": path.name, "size": path.stat().st_size}
            for name, path in (("kernel", assets.kernel), ("initrd", assets.initrd),
                               ("tools", assets.tools))
        }

    def driver(self, machine: QemuMachine) -> Driver:
        if self.custom is not None and not self.custom.contract.exists():
            return ContractCheck(self.surface, machine, self.custom)
        return NoScreen(self.surface)


@dataclass(frozen=True, slots=True)
class CustomPack:
    """The pack of a registry image (a workspace's ``rigs.smolvm.execImage``)."""

    reference: str
    digest: str
    rootfs: Path

    @property
    def contract(self) -> Path:
        """Written once the image passed the terminal contract check (its first boot)."""
        return self.rootfs.parent / "contract.json"


#: What RIGS.md §3 asks of a terminal image.
CONTRACT = ("bash", "git", "curl", "socat")
BUSYBOX = "/.rigd/bin/busybox"


def contract_script(needs: Sequence[str]) -> str:
    """The check, run by the tools disk's busybox (the image may have no shell at all): a
    name is a program on the image's PATH, a path (``/usr/bin/chromium``) an executable file."""
    tests = []
    for need in needs:
        test = f"[ -x {need} ]" if need.startswith("/") else f"command -v {need} >/dev/null 2>&1"
        tests.append(f"{test} || echo 'missing {need}'")
    return "; ".join([
        "export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", *tests,
        "command -v apt-get >/dev/null 2>&1 && echo apt",
        "[ -r /etc/os-release ] && . /etc/os-release && echo \"os $PRETTY_NAME\"", "true"])


CONTRACT_SCRIPT = contract_script(CONTRACT)


def contract_problem(reference: str, report: str, needs: Sequence[str] = CONTRACT,
                     kind: str = "terminal") -> str | None:
    """What the check's output says is missing (None: the image keeps the contract)."""
    lines = report.splitlines()
    missing = [line.removeprefix("missing ") for line in lines if line.startswith("missing ")]
    if not missing:
        return None
    os_name = next((line.removeprefix("os ") for line in lines if line.startswith("os ")), "")
    where = f" ({os_name})" if os_name else ""
    text = (f"the image {reference}{where} is not a {kind} image: it lacks "
            f"{', '.join(missing)} (RIGS.md §3 asks for {', '.join(needs)})")
    if "apt" in lines:
        text += ("; it has apt-get, but installing packages into a custom image at its first "
                 "start is not built yet: install them in the image itself")
    return text


async def check_contract(machine: QemuMachine, pack: CustomPack, needs: Sequence[str], kind: str,
                         left_s: float) -> None:
    """Run the contract check in the guest once per pack: a failure fails the rig naming what
    is missing; a pass is recorded beside the pack, so later rigs skip it."""
    if pack.contract.exists():
        return
    res = await machine.exec([BUSYBOX, "sh", "-c", contract_script(needs)], cwd="/", env=None,
                             stdin=None, timeout_s=max(5.0, min(left_s, 60.0)), max_output=16_384)
    if res.exit_code != 0:
        raise BackendError(f"the {kind} contract check of {pack.reference} could not run "
                           f"(exit {res.exit_code}): {res.stderr.decode('utf-8', 'replace')[-300:]}")
    problem = contract_problem(pack.reference, res.stdout.decode("utf-8", "replace"), needs, kind)
    if problem is not None:
        raise BackendError(problem, image=pack.digest)
    doc = {"reference": pack.reference, "digest": pack.digest, "passed": list(needs)}
    await trio.to_thread.run_sync(_write_contract, pack.contract, doc)


class ContractCheck(NoScreen):
    """A terminal whose custom image has not yet passed the contract check: the check is
    its readiness."""

    def __init__(self, surface: Surface, machine: QemuMachine, pack: CustomPack) -> None:
        super().__init__(surface)
        self.machine = machine
        self.pack = pack

    async def ready(self, progress: Callable[[str], None], *, warm: bool, left_s: float) -> None:
        progress("checking the image's terminal contract")
        await check_contract(self.machine, self.pack, CONTRACT, "terminal", left_s)


def _write_contract(path: Path, doc: dict[str, Any]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc) + "\n")
    os.replace(tmp, path)


#: Pull (if needed) and pack a registry reference: (digest, the pack's rootfs).
CustomPacker = Callable[[str, Callable[[str], None]], Awaitable[tuple[str, Path]]]


class TerminalImages:
    """The recipe source of terminal rigs: the pack, unpacked once (under a lock); a custom
    image's pack through ``custom`` (the server's pulls)."""

    def __init__(self, config: QemuConfig, assets: TerminalAssets,
                 ensure_pack: Callable[[Callable[[str], None]], Path],
                 custom: CustomPacker | None = None) -> None:
        self.config = config
        self.assets = assets
        self._ensure_pack = ensure_pack
        self._custom = custom
        self._lock = trio.Lock()

    async def pack(self, progress: Callable[[str], None]) -> Path:
        async with self._lock:
            return await trio.to_thread.run_sync(self._ensure_pack, progress)

    async def recipe(self, spec: MachineSpec, progress: Callable[[str], None]) -> TerminalRecipe:
        if spec.image is None:
            return TerminalRecipe(self.config, self.assets, await self.pack(progress))
        if self._custom is None:
            raise BackendError(f"this server cannot boot registry images (asked for {spec.image})")
        digest, rootfs = await self._custom(spec.image, progress)
        return TerminalRecipe(self.config, self.assets, rootfs,
                              custom=CustomPack(spec.image, digest, rootfs))


def terminal_backend(
    config: QemuConfig, assets: TerminalAssets, ensure_pack: Callable[[Callable[[str], None]], Path], *,
    layout: Layout | None = None, uids: UidPool | None = None, snapshots: SnapshotService | None = None,
    custom: CustomPacker | None = None,
) -> QemuBackend:
    return QemuBackend(Backend.SMOLVM, config, TerminalImages(config, assets, ensure_pack, custom),
                       layout=layout, uids=uids, snapshots=snapshots)


async def prepare_terminals(backend: QemuBackend, memory_mb: int, vcpus: int,
                            progress: Callable[[str], None]) -> None:
    """Unpack the pack and make sure the default shape has (or is building) a snapshot."""
    images = backend.recipes
    assert isinstance(images, TerminalImages)
    spec = MachineSpec(rig_id="prepare", surface=Surface.TERMINAL, memory_mb=memory_mb, vcpus=vcpus)
    recipe = await images.recipe(spec, progress)
    await backend.snapshots.ensure(recipe, spec)


__all__ = [
    "CONTRACT",
    "ContractCheck",
    "CustomPack",
    "CustomPacker",
    "NetworkConfig",
    "QemuConfig",
    "TerminalImages",
    "TerminalRecipe",
    "check_contract",
    "contract_script",
    "prepare_terminals",
    "rig_argv",
    "terminal_backend",
]
