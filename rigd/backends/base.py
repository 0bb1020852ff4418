"""The one small interface every backend implements, and the values that
cross it.

A backend turns a :class:`MachineSpec` into a running :class:`Machine`.
``open_machine`` is an async context manager: entering boots the machine
(reporting each step through ``progress``) and yields it ready; leaving tears
it down completely — process, sockets, overlays — inside a shielded scope, so
cancellation never leaves a machine behind.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

from rigd.frames import Still
from rigd.model import Accel, Backend, Surface

if TYPE_CHECKING:
    from netgate.policy import Policy
    from netgate.proxy import AuditEvent
    from rigd.backends.lanes import Lanes
    from rigd.browser.profiles import ProfileState
    from rigd.protocols.input import Step
    from rigd.verbs import Action


@dataclass(frozen=True, slots=True)
class NetSpec:
    """A rig's egress: its gateway policy (``netgate.policy.Policy``), where the
    gateway's decisions go (a non-blocking callback), and its workspace (for
    the credential broker)."""

    policy: Policy
    audit: Callable[[AuditEvent], None]
    workspace: str


@dataclass(frozen=True, slots=True)
class VolumeMount:
    """A workspace volume attached to a machine (issue 29): its host file, where the guest
    mounts it, and whether only for reading."""

    name: str
    image: Path
    path: str
    read_only: bool


@dataclass(frozen=True, slots=True)
class ForkImage:
    """A running machine frozen for a fork (``rig.fork``): its RAM (``memory``, zstd) and a
    copy of its disk overlay (``disk``), taken in one pause, in a directory of their own
    (``dir``) that the manager removes once every copy has restored from it.

    ``spec`` is the parent machine's own spec: a copy starts QEMU with the same devices,
    memory and display (only its id, network and files are its own)."""

    dir: Path
    disk: Path
    memory: Path
    spec: MachineSpec
    parent: str
    #: How long the parent's vCPUs stood still, and what QEMU sent (for the audit row and bench).
    paused_s: float = 0.0
    ram_bytes: int = 0
    #: The image at the bottom of ``disk``'s backing chain when ``disk`` was made to depend on
    #: it alone (a named snapshot outlives the warm-start snapshot a rig's overlay was over).
    base: Path | None = None


@dataclass(frozen=True, slots=True)
class MachineSpec:
    rig_id: str
    surface: Surface
    memory_mb: int
    vcpus: int
    network: NetSpec | None = None
    #: The accelerator this machine asks for (computer rigs name it through their
    #: backend: qemu-kvm, qemu-hvf, qemu-tcg); None: the backend's own.
    accel: Accel | None = None
    #: The boot display mode (computer rigs) or viewport (browser rigs).
    display: tuple[int, int] | None = None
    #: The browser engine (``rigd.model.Engine`` value) of a browser rig.
    engine: str | None = None
    #: A browser rig's profile: (owner user id, profile name).
    profile: tuple[str, str] | None = None
    #: A terminal rig's custom image: a registry reference (a workspace's
    #: ``rigs.smolvm.execImage``), pulled on the host if absent; None: the built-in image.
    image: str | None = None
    #: Start as a copy of a frozen machine (``rig.fork``) instead of booting or a warm start.
    fork: ForkImage | None = None
    #: A browser fork's seed: the parent engine's cookies, storage and tabs, put into this
    #: rig's fresh engine before its first verb (kept nowhere: not a saved profile).
    browser_state: ProfileState | None = None
    #: Volumes to attach (virtio-blk, by fd) and mount (terminal rigs).
    volumes: tuple[VolumeMount, ...] = ()


@dataclass(frozen=True, slots=True)
class ExecResult:
    exit_code: int | None
    signal: int | None
    timed_out: bool
    stdout: bytes
    stderr: bytes
    stdout_truncated: bool
    stderr_truncated: bool
    duration_ms: int


@dataclass(frozen=True, slots=True)
class MachineInfo:
    """What a running machine reports about itself (shown on the Rig)."""

    backend: Backend
    accel: Accel
    pid: int | None
    pid_start_ticks: int | None
    image: str | None
    confinement: Mapping[str, Any] = field(default_factory=dict)
    security_boundary: bool = True
    #: "warm": restored from the pack's memory snapshot; "cold": the kernel booted.
    boot: str = "cold"


class Frame(NamedTuple):
    """One still of a machine's screen and where it came from."""

    still: Still
    #: "agent" (the in-guest grab) or "qmp" (QMP screendump, scaled on the host).
    source: str
    #: The pointer in display pixels, when the source knows it.
    cursor: tuple[int, int] | None
    #: Whether the pointer is drawn into the image.
    cursor_marked: bool


class PtySession(Protocol):
    """An interactive terminal inside the machine."""

    async def write(self, data: bytes) -> None: ...
    async def resize(self, cols: int, rows: int) -> None: ...
    def output(self) -> AsyncIterator[bytes]:
        """Output chunks until the PTY's process exits."""
        ...
    @property
    def exit_status(self) -> dict[str, int | None] | None: ...
    async def aclose(self) -> None: ...


class Machine(Protocol):
    info: MachineInfo

    async def exec(
        self,
        argv: Sequence[str],
        *,
        cwd: str | None,
        env: Mapping[str, str] | None,
        stdin: bytes | None,
        timeout_s: float,
        max_output: int,
    ) -> ExecResult: ...

    def open_pty(
        self, *, cols: int, rows: int
    ) -> AbstractAsyncContextManager[PtySession]: ...

    async def wait_failed(self) -> str:
        """Return (with a short reason) when the machine dies on its own."""
        ...

    def console_tail(self, max_bytes: int = 4096) -> str: ...

    async def perform(self, action: Action) -> dict[str, Any]:
        """Run a verb other than ``exec`` (typed action from :mod:`rigd.verbs`); a verb
        the machine's surface does not answer is a field error naming ``action.action``."""
        ...

    async def take_profile(self, owner: str, name: str) -> None:
        """Load ``owner``'s saved browser profile ``name`` into the running engine and keep it
        from now on (a pooled browser rig's hand-over); a field error naming ``profile`` on a
        machine that keeps none."""
        ...

    async def browser_state(self) -> ProfileState:
        """The running engine's cookies, local storage and open tabs (a browser fork's seed);
        a field error naming ``rigId`` on a machine without an engine."""
        ...

    @property
    def display(self) -> tuple[int, int] | None:
        """The screen's current mode in pixels; None for a machine without a screen."""
        ...

    async def still(self, *, max_w: int, max_h: int, fmt: str = "jpeg", quality: int = 75,
                    mark_cursor: bool = True) -> Frame:
        """A still of the screen fitted into ``max_w``x``max_h`` (a field error without a screen)."""
        ...

    async def send_input(self, steps: Sequence[Step]) -> None:
        """Send an input plan (:mod:`rigd.protocols.input`) through the hypervisor."""
        ...

    async def park(self) -> None:
        """Stop the vCPUs; memory stays resident."""
        ...

    def set_egress(self, policy: Policy) -> None:
        """Replace the live allowlist (``netgate.policy.Policy``); in force at once."""
        ...

    def network_info(self) -> dict[str, Any]:
        """How the machine reaches the network (mode, allowlist); ``{"mode": "none"}`` if not."""
        ...

    async def wake(self) -> None:
        """Resume the vCPUs after :meth:`park`."""
        ...

    async def quiesce(self) -> None:
        """Before a requested close, while the guest still answers: flush and unmount what
        must outlive the machine (its volumes). Never raises; bounded in time."""
        ...

    def resident_mb(self) -> int:
        """Host-resident memory of the machine's process, in MB (0 if unknown)."""
        ...

    def channel_stats(self) -> dict[str, int]:
        """Counters of the guest channel (garbage seen, orphan replies …)."""
        ...

    def lanes(self) -> Lanes:
        """The clipboard and file lanes (RIGS.md §10) of this machine."""
        ...

    def port_channel(self) -> Path | None:
        """The Unix socket of the guest's port multiplexer (terminal rigs, RIGS.md §8); None without one."""
        ...


class MachineBackend(Protocol):
    name: Backend

    def open_machine(
        self, spec: MachineSpec, progress: Callable[[str], None]
    ) -> AbstractAsyncContextManager[Machine]: ...

    async def freeze(self, machine: Machine, *, standalone: bool = False) -> ForkImage:
        """Pause ``machine`` for as short a time as possible, keep its RAM and disk in a
        :class:`ForkImage` and resume it; a machine this backend cannot fork is a
        :class:`~rigd.errors.Conflict`. ``standalone``: then (the machine running again) make
        the disk depend only on its chain's base image (``ForkImage.base``). The caller
        removes ``ForkImage.dir``."""
        ...
