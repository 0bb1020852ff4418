"""What a surface supplies to boot on QEMU: a recipe and a driver.

One :class:`rigd.backends.qemu.QemuMachine` runs every QEMU surface. What
differs between a terminal microVM and an X11 desktop (and, next, a browser
microVM) is small and lives here as two seams:

- a :class:`BootRecipe`, bound at open time to the image it boots (a pack, an
  imported qcow2): the QEMU argv for a rig's paths, the backing file of its
  overlay, the warm-start shape, the deadlines and what the rig says it is;
- a :class:`Driver`, made by the recipe for one running machine: readiness
  beyond the agent's hello (a desktop waits for X and a window manager) and
  the surface's verbs, frames and input.

An open computes an :class:`OpenPlan` from the recipe and the warm-start
state without I/O (:func:`plan_open`) and the backend carries it out.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from rigd.backends.base import Frame, MachineSpec
from rigd.backends.lanes import DropTarget
from rigd.backends.snapshot import Snapshot, SnapshotStore
from rigd.errors import FieldError
from rigd.model import Accel, Backend, Surface

if TYPE_CHECKING:
    from rigd.backends.qemu import QemuMachine
    from rigd.browser.profiles import ProfileState
    from rigd.protocols.input import Step
    from rigd.verbs import Action


@dataclass(frozen=True, slots=True)
class RigPaths:
    """Where one machine's files are (real paths, or a snapshot key's placeholders)."""

    rig_dir: Path
    overlay: Path

    @property
    def qmp(self) -> Path:
        return self.rig_dir / "qmp.sock"

    @property
    def agent(self) -> Path:
        return self.rig_dir / "agent.sock"

    @property
    def console(self) -> Path:
        return self.rig_dir / "console.sock"


#: The paths a snapshot key is computed with (a rig's own paths never change its key).
PLACEHOLDER_PATHS = RigPaths(Path("/@rig"), Path("/@disk"))


@dataclass(frozen=True, slots=True)
class Identity:
    """What a machine of a recipe says it is (shown on the Rig)."""

    backend: Backend
    accel: Accel
    image: str | None


#: A terminal's drops: beside the worktree (/root), never inside it.
TERMINAL_DROPS = DropTarget(dir="~/drops", owner="root", told="none")


class Driver(Protocol):
    """A surface's half of a running machine."""

    #: Where files dropped into the machine land.
    drop_target: DropTarget

    @property
    def display(self) -> tuple[int, int] | None: ...

    async def ready(self, progress: Callable[[str], None], *, warm: bool, left_s: float) -> None:
        """Return once the surface is usable (the agent already answered hello)."""
        ...

    async def perform(self, action: Action) -> dict[str, Any]: ...

    async def still(self, *, max_w: int, max_h: int, fmt: str, quality: int,
                    mark_cursor: bool) -> Frame: ...

    async def send_input(self, steps: Sequence[Step]) -> None: ...


@runtime_checkable
class ProfileTaker(Protocol):
    """A driver that can put an owner's saved profile into its running engine (a browser's):
    how a pooled rig takes the profile its caller opens with (issue 28); and read what its
    engine holds now (``rig.fork`` of a browser, issue 29)."""

    async def take_profile(self, owner: str, name: str) -> None: ...

    async def browser_state(self) -> ProfileState:
        """The running engine's cookies, local storage and open tabs (a browser fork's seed)."""
        ...


class BootRecipe(Protocol):
    """How machines of one surface, booting one image, are started."""

    @property
    def surface(self) -> Surface: ...

    @property
    def backing(self) -> Path:
        """The file every rig's overlay is backed by."""
        ...

    @property
    def backing_format(self) -> str:
        """The backing file's format ("raw", "qcow2")."""
        ...

    @property
    def volume_bus(self) -> str:
        """Where a volume's virtio-blk disk goes: "device" (a microvm's MMIO) or "pci" (q35)."""
        ...

    @property
    def volume_owner(self) -> str | None:
        """The guest user a writable volume's top directory is given to at mount (a desktop's
        session user), or None: root's, as made."""
        ...

    def identity(self, spec: MachineSpec) -> Identity: ...

    def boot_deadline_s(self, spec: MachineSpec) -> float:
        """How long a cold boot may take up to the surface being ready."""
        ...

    def argv(self, spec: MachineSpec, at: RigPaths, *, mac: str | None, incoming: bool,
             tap_fd: int | str | None) -> list[str]:
        """The QEMU command line of one machine (``tap_fd`` ``"@fd"`` in a snapshot key)."""
        ...

    def warm_eligible(self, spec: MachineSpec) -> bool:
        """Whether a rig of this spec may start from (and seed) a memory snapshot."""
        ...

    @property
    def snapshot_at_hello(self) -> bool:
        """Where this shape's snapshot is taken. True: a standby point, once the agent answers
        hello and before the surface's own start (a browser's engine), which every restored
        machine then runs itself; False: once the surface is ready (a desktop's X session)."""
        ...

    def warm_shape(self, spec: MachineSpec) -> tuple[list[str], dict[str, Any]]:
        """The argv of this shape at :data:`PLACEHOLDER_PATHS`, and the assets' identity."""
        ...

    def driver(self, machine: QemuMachine) -> Driver: ...


class RecipeSource(Protocol):
    """Finds (imports, unpacks) the image an open boots and binds a recipe to it."""

    async def recipe(self, spec: MachineSpec, progress: Callable[[str], None]) -> BootRecipe: ...


@dataclass(frozen=True, slots=True)
class WarmPlan:
    """Where a machine of one shape stands with warm starts (made in a worker thread)."""

    store: SnapshotStore
    key: str
    material: dict[str, Any]
    snapshot: Snapshot | None


@dataclass(frozen=True, slots=True)
class OpenPlan:
    """What an open will do, decided before it does anything."""

    #: Restore this snapshot (warm), or None: boot the kernel (cold).
    snapshot: Snapshot | None
    #: What the overlay is backed by: the snapshot's disk when warm, else the recipe's image.
    backing: Path
    backing_format: str
    #: The warm-start state of this shape, to seed a snapshot after a cold boot (None: never).
    warm: WarmPlan | None


def plan_open(recipe: BootRecipe, warm: WarmPlan | None) -> OpenPlan:
    """Warm when the shape has a snapshot, else cold (and seed one if the shape may)."""
    if warm is not None and warm.snapshot is not None:
        return OpenPlan(warm.snapshot, warm.snapshot.disk, "qcow2", warm)
    return OpenPlan(None, recipe.backing, recipe.backing_format, warm)


def cold_plan(recipe: BootRecipe, warm: WarmPlan | None) -> OpenPlan:
    """The plan after a warm start failed: boot cold, and seed the shape again (the
    snapshot service's :func:`~rigd.backends.snapshot.should_build` rebuilds a
    discarded snapshot once, then leaves a shape that keeps failing alone)."""
    return OpenPlan(None, recipe.backing, recipe.backing_format, warm)


class NoScreen:
    """The driver of a surface without a screen (terminal rigs): only ``exec`` and PTYs."""

    def __init__(self, surface: Surface) -> None:
        self.surface = surface
        self.drop_target = TERMINAL_DROPS

    @property
    def display(self) -> tuple[int, int] | None:
        return None

    async def ready(self, progress: Callable[[str], None], *, warm: bool, left_s: float) -> None:
        return None

    async def perform(self, action: Action) -> dict[str, Any]:
        raise FieldError("action.action", f"a {self.surface} rig answers only exec, not {action.verb}")

    async def still(self, *, max_w: int, max_h: int, fmt: str, quality: int,
                    mark_cursor: bool) -> Frame:
        raise FieldError("action.action", f"a {self.surface} rig has no screen")

    async def send_input(self, steps: Sequence[Step]) -> None:
        raise FieldError("action.action", f"a {self.surface} rig has no pointer or keyboard")
