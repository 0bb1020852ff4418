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
from typing import Any, Protocol

from rigd.model import Accel, Backend, Surface


@dataclass(frozen=True, slots=True)
class NetSpec:
    """A rig's egress: its gateway policy (``netgate.policy.Policy``), where the
    gateway's decisions go (a non-blocking callback), and its workspace (for
    the credential broker)."""

    policy: Any
    audit: Callable[[Any], None]
    workspace: str


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
    #: The boot display mode (computer rigs).
    display: tuple[int, int] | None = None


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

    async def perform(self, action: Any) -> dict[str, Any]:
        """Run a verb other than ``exec`` (typed action from :mod:`rigd.verbs`)."""
        ...

    async def park(self) -> None:
        """Stop the vCPUs; memory stays resident."""
        ...

    def set_egress(self, policy: Any) -> None:
        """Replace the live allowlist (``netgate.policy.Policy``); in force at once."""
        ...

    def network_info(self) -> dict[str, Any]:
        """How the machine reaches the network (mode, allowlist); ``{"mode": "none"}`` if not."""
        ...

    async def wake(self) -> None:
        """Resume the vCPUs after :meth:`park`."""
        ...

    def resident_mb(self) -> int:
        """Host-resident memory of the machine's process, in MB (0 if unknown)."""
        ...

    def channel_stats(self) -> dict[str, int]:
        """Counters of the guest channel (garbage seen, orphan replies …)."""
        ...


class MachineBackend(Protocol):
    name: Backend

    def open_machine(
        self, spec: MachineSpec, progress: Callable[[str], None]
    ) -> AbstractAsyncContextManager[Machine]: ...
