"""An in-memory backend for unit tests of the rig manager (STYLE.md: the fake
lives beside the interface). It boots nothing; ``exec`` answers ``echo`` and
``exit N`` and can be told to die, to fail at boot, or to hang. Computer rigs
get a :class:`FakeDesktopMachine`: a screen that changes on every grab (for
tests of the live view's transport, not of what it shows)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import trio

from rigd.backends.base import ExecResult, Frame, MachineInfo, MachineSpec
from rigd.errors import BackendError, FieldError
from rigd.frames import Still
from rigd.model import Accel, Backend, Surface
from rigd.protocols.input import Step


@dataclass(slots=True)
class FakeMachine:
    spec: MachineSpec
    info: MachineInfo
    died: trio.Event = field(default_factory=trio.Event)
    closed: bool = False
    parked: bool = False
    rss_mb: int = 100
    calls: list[list[str]] = field(default_factory=list)
    performed: list[str] = field(default_factory=list)
    policy: Any = None
    #: What ``perform`` answers per verb (default: ``{"performed": verb}``).
    answers: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: Set to make the machine's faulty pump raise (see ``FakeBackend.fault``).
    fault_now: trio.Event = field(default_factory=trio.Event)

    async def _faulty_pump(self, kind: str) -> None:
        """A machine task with a bug: raises once ``fault_now`` is set."""
        await self.fault_now.wait()
        if kind == "pump-group":
            raise ExceptionGroup("pumps", [ValueError("fake pump broke"), KeyError("fake reader")])
        raise ValueError("fake pump broke")

    async def exec(
        self,
        argv: Sequence[str],
        *,
        cwd: str | None,
        env: Mapping[str, str] | None,
        stdin: bytes | None,
        timeout_s: float,
        max_output: int,
    ) -> ExecResult:
        self.calls.append(list(argv))
        await trio.lowlevel.checkpoint()
        if argv[:1] == ["echo"]:
            out = (" ".join(argv[1:]) + "\n").encode()
            return ExecResult(0, None, False, out[:max_output], b"", len(out) > max_output, False, 1)
        if argv[:1] == ["exit"] and len(argv) == 2 and argv[1].isdigit():
            return ExecResult(int(argv[1]), None, False, b"", b"", False, False, 1)
        if argv[:1] == ["cat"] and stdin is not None:
            return ExecResult(0, None, False, stdin[:max_output], b"", len(stdin) > max_output, False, 1)
        return ExecResult(127, None, False, b"", f"fake: {argv[0]}: not found\n".encode(), False, False, 1)

    def open_pty(self, *, cols: int, rows: int) -> AsyncIterator[None]:
        raise BackendError("the fake backend has no PTY")

    async def wait_failed(self) -> str:
        await self.died.wait()
        return "fake machine died"

    def console_tail(self, max_bytes: int = 4096) -> str:
        return "fake console\n"

    def channel_stats(self) -> dict[str, int]:
        return {}

    async def perform(self, action: Any) -> dict[str, Any]:
        await trio.lowlevel.checkpoint()
        self.performed.append(action.verb)
        return self.answers.get(action.verb, {"performed": action.verb})

    @property
    def display(self) -> tuple[int, int] | None:
        return None

    async def still(self, *, max_w: int, max_h: int, fmt: str = "jpeg", quality: int = 75,
                    mark_cursor: bool = True) -> Frame:
        raise FieldError("action.action", "a fake rig has no screen")

    async def send_input(self, steps: Sequence[Step]) -> None:
        raise FieldError("action.action", "a fake rig has no pointer or keyboard")

    async def park(self) -> None:
        self.parked = True

    def set_egress(self, policy: Any) -> None:
        self.policy = policy

    def network_info(self) -> dict[str, Any]:
        allow = list(getattr(self.policy, "allow", ())) if self.policy is not None else []
        return {"mode": "fake", "allow": allow}

    async def wake(self) -> None:
        self.parked = False

    def resident_mb(self) -> int:
        return self.rss_mb


@dataclass(slots=True)
class FakeDesktopMachine(FakeMachine):
    """A computer rig's fake machine. Every still is new: ``still_bytes`` bytes
    (scaled into the asked size) whose every 8-byte word is the grab number,
    so a reader can tell frames apart and see a torn one; input plans are
    recorded in ``plans``."""

    screen: tuple[int, int] = (1280, 800)
    still_bytes: int = 48 * 1024
    grabs: int = 0
    plans: list[list[Step]] = field(default_factory=list)

    @property
    def display(self) -> tuple[int, int] | None:
        return self.screen

    async def still(self, *, max_w: int, max_h: int, fmt: str = "jpeg", quality: int = 75,
                    mark_cursor: bool = True) -> Frame:
        await trio.lowlevel.checkpoint()
        self.grabs += 1
        w, h = self.screen
        scale = max(w / max_w, h / max_h, 1.0)
        data = self.grabs.to_bytes(8, "big") * (self.still_bytes // 8)
        media = "image/png" if fmt == "png" else "image/jpeg"
        return Frame(Still(data, media, w, h, round(w / scale), round(h / scale), scale), "fake", None, False)

    async def send_input(self, steps: Sequence[Step]) -> None:
        await trio.lowlevel.checkpoint()
        self.plans.append(list(steps))


class FakeBackend:
    name = Backend.SMOLVM

    def __init__(self) -> None:
        self.machines: list[FakeMachine] = []
        self.fail_boot: str | None = None
        self.boot_gate: trio.Event | None = None
        #: Fault injection: ``"pump"`` / ``"pump-group"`` (a machine task raises, plain or
        #: grouped, once the machine's ``fault_now`` is set), ``"restore"`` (a bug while the
        #: machine comes up, as a snapshot restore could have).
        self.fault: str | None = None

    @asynccontextmanager
    async def open_machine(
        self, spec: MachineSpec, progress: Callable[[str], None]
    ) -> AsyncIterator[FakeMachine]:
        progress("unpacking image")
        await trio.lowlevel.checkpoint()
        progress("booting kernel")
        if self.boot_gate is not None:
            await self.boot_gate.wait()
        if self.fail_boot:
            raise BackendError(self.fail_boot, console="fake console: boot failed")
        info = MachineInfo(Backend.SMOLVM, Accel.TCG, pid=None, pid_start_ticks=None,
                           image="sha256:fake", security_boundary=False)
        if self.fault == "restore":
            raise LookupError("fake restore bug")
        kind = FakeDesktopMachine if spec.surface is Surface.COMPUTER else FakeMachine
        machine = kind(spec, info, policy=spec.network.policy if spec.network else None)
        if isinstance(machine, FakeDesktopMachine) and spec.display is not None:
            machine.screen = spec.display
        self.machines.append(machine)
        async with trio.open_nursery() as nursery:  # the machine's own tasks
            if self.fault in ("pump", "pump-group"):
                nursery.start_soon(machine._faulty_pump, self.fault)
            try:
                yield machine
            finally:
                machine.closed = True
                nursery.cancel_scope.cancel()
