"""An in-memory backend for unit tests of the rig manager (STYLE.md: the fake
lives beside the interface). It boots nothing; ``exec`` answers ``echo`` and
``exit N`` and can be told to die, to fail at boot, or to hang. Computer rigs
get a :class:`FakeDesktopMachine`: a screen that changes on every grab (for
tests of the live view's transport, not of what it shows)."""

from __future__ import annotations

import functools
import hashlib
import tempfile
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio

from rigd.backends.base import ExecResult, ForkImage, Frame, MachineInfo, MachineSpec
from rigd.backends.lanes import MAX_FILE_BYTES, Clip, DropEvent, DropTarget, SavedFile
from rigd.backends.recipe import TERMINAL_DROPS
from rigd.browser.profiles import ProfileState
from rigd.errors import BackendError, Conflict, FieldError
from rigd.frames import Changes, Lane, Still
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
    #: The parsed actions performed, in order (a test reads what reached the machine).
    actions: list[Any] = field(default_factory=list)
    policy: Any = None
    #: What ``perform`` answers per verb (default: ``{"performed": verb}``).
    answers: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: Set to make the machine's faulty pump raise (see ``FakeBackend.fault``).
    fault_now: trio.Event = field(default_factory=trio.Event)
    #: The machine's lanes (made on first use; tests may replace them).
    fake_lanes: FakeLanes | None = None
    #: The profile a hand-over gave the machine: (owner, name); set from the spec at boot.
    profile: tuple[str, str] | None = None
    #: ``quiesce`` ran (a requested close, before the teardown).
    quiesced: bool = False

    def port_channel(self) -> Path | None:
        return None

    def lanes(self) -> FakeLanes:
        if self.fake_lanes is None:
            screen = self.display is not None
            target = DropTarget("~/Drops", "rig", "clipboard") if screen else TERMINAL_DROPS
            self.fake_lanes = FakeLanes(target, screen=screen,
                                        features=frozenset({"files", "clipboard_image"}))
        return self.fake_lanes

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
        self.actions.append(action)
        return self.answers.get(action.verb, {"performed": action.verb})

    async def browser_state(self) -> ProfileState:
        await trio.lowlevel.checkpoint()
        if self.spec.surface is not Surface.BROWSER:
            raise FieldError("rigId", f"a {self.spec.surface} rig has no browser engine")
        return ProfileState(tabs=[f"https://example.com/{self.spec.rig_id}"])

    async def take_profile(self, owner: str, name: str) -> None:
        await trio.lowlevel.checkpoint()
        if self.spec.surface is not Surface.BROWSER:
            raise FieldError("profile", f"a {self.spec.surface} rig keeps no browser profile")
        if self.profile is not None:
            raise BackendError(f"this rig already keeps profile {self.profile[1]!r}")
        self.profile = (owner, name)

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

    async def quiesce(self) -> None:
        await trio.lowlevel.checkpoint()
        self.quiesced = True

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
    #: Change notices (an agent with ``damage``): the screen then changes only
    #: when a test calls :meth:`change`, and live views wait for notices.
    notices: bool = False
    #: The screen's content (bumped by :meth:`change`; the stills' words in notices mode).
    version: int = 0
    #: Open change subscriptions (live views).
    watchers: list[Changes] = field(default_factory=list)
    #: Seconds each live grab takes (a test of pacing sets it).
    grab_s: float = 0.0

    def change(self, rects: Sequence[tuple[int, int, int, int]] = ((0, 0, 10, 10),)) -> None:
        """The screen changes: new content, and a damage notice to every live view."""
        self.version += 1
        for changes in self.watchers:
            changes.damage(rects)

    @asynccontextmanager
    async def open_changes(self) -> AsyncIterator[Changes | None]:
        if not self.notices:
            yield None
            return
        changes = Changes()
        self.watchers.append(changes)
        try:
            yield changes
        finally:
            self.watchers.remove(changes)

    async def live_still(self, *, max_w: int, max_h: int, quality: int) -> tuple[Frame, Lane]:
        if self.grab_s:
            await trio.sleep(self.grab_s)
        frame = await self.still(max_w=max_w, max_h=max_h, quality=quality)
        return frame, Lane("fake", "measured: the fake's only lane", {"fake": 0.0})

    @property
    def display(self) -> tuple[int, int] | None:
        return self.screen

    async def still(self, *, max_w: int, max_h: int, fmt: str = "jpeg", quality: int = 75,
                    mark_cursor: bool = True) -> Frame:
        await trio.lowlevel.checkpoint()
        self.grabs += 1
        w, h = self.screen
        scale = max(w / max_w, h / max_h, 1.0)
        word = self.version if self.notices else self.grabs
        data = word.to_bytes(8, "big") * (self.still_bytes // 8)
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
        #: ``freeze`` refuses (a backend that cannot fork) when set.
        self.refuse_fork: str | None = None
        self.frozen: list[ForkImage] = []

    async def freeze(self, machine: Any, *, standalone: bool = False) -> ForkImage:
        """A frozen fake: an empty directory (the manager removes it) and the parent's spec."""
        await trio.lowlevel.checkpoint()
        if self.refuse_fork:
            raise Conflict(self.refuse_fork)
        assert isinstance(machine, FakeMachine)
        made = await trio.to_thread.run_sync(functools.partial(tempfile.mkdtemp, prefix="rigd-fakefork-"))
        into = Path(made)
        for name, body in (("disk.qcow2", b"fake disk"), ("memory.zst", b"fake memory")):
            (into / name).write_bytes(body)
        image = ForkImage(dir=into, disk=into / "disk.qcow2", memory=into / "memory.zst",
                          spec=machine.spec, parent=machine.spec.rig_id, paused_s=0.01, ram_bytes=1 << 20)
        self.frozen.append(image)
        return image

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
        machine = kind(spec, info, policy=spec.network.policy if spec.network else None,
                       profile=spec.profile)
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


class FakeLanes:
    """The lanes of a fake machine over an in-memory guest filesystem (``files``:
    path → bytes) and selections (``selections``: name → Clip). Same rules as the
    agent: a drop is invisible until committed; a colliding name becomes ``2-name``."""

    def __init__(self, target: DropTarget, *, screen: bool, features: frozenset[str]) -> None:
        self.target = target
        self.screen = screen
        self.features = features
        self.drop_event: DropEvent | None = None
        self.files: dict[str, bytes] = {}
        self.selections: dict[str, Clip] = {}
        self.home = "/home/rig" if screen else "/root"
        #: Bytes a write pauses after (tests of a client that disconnects mid-upload).
        self.stall: trio.Event | None = None

    def missing(self, lane: str) -> str | None:
        if lane == "files":
            return None if "files" in self.features else "rebuild the image (fake: no files)"
        if not self.screen:
            return "a terminal rig has no clipboard (it has no X session); use the file lane"
        return None if "clipboard_image" in self.features else "rebuild the image (fake: no clipboard)"

    @asynccontextmanager
    async def drop(self) -> AsyncIterator[_FakeDrop]:
        drop = _FakeDrop(self)
        yield drop

    @asynccontextmanager
    async def read_file(self, path: str, max_bytes: int) -> AsyncIterator[_FakeSource]:
        await trio.lowlevel.checkpoint()
        if path not in self.files:
            if any(p.startswith(path.rstrip("/") + "/") for p in self.files):
                raise FieldError("p", "not a regular file: directory")
            raise FieldError("p", f"no such file or directory: {path}")
        data = self.files[path]
        if len(data) > max_bytes:
            raise FieldError("p", f"file is {len(data)} bytes, over the limit of {max_bytes}")
        yield _FakeSource(path.rsplit("/", 1)[-1], data)

    async def clipboard_get(self, selection: str) -> Clip | None:
        await trio.lowlevel.checkpoint()
        return self.selections.get(selection)

    async def clipboard_set(self, selection: str, clip: Clip) -> None:
        await trio.lowlevel.checkpoint()
        self.selections[selection] = clip


class _FakeSink:
    def __init__(self, lanes: FakeLanes, name: str) -> None:
        self.lanes = lanes
        self.name = name
        self.data = bytearray()

    async def write(self, data: bytes) -> None:
        if self.lanes.stall is not None:
            await self.lanes.stall.wait()
        await trio.lowlevel.checkpoint()
        if len(self.data) + len(data) > MAX_FILE_BYTES:
            raise FieldError("files", f"{self.name!r} is over 256 MB")
        self.data += data

    async def close(self) -> tuple[int, str]:
        await trio.lowlevel.checkpoint()
        return len(self.data), hashlib.sha256(self.data).hexdigest()


class _FakeDrop:
    def __init__(self, lanes: FakeLanes) -> None:
        self.lanes = lanes
        self.target = lanes.target
        self.sinks: list[_FakeSink] = []

    async def add(self, name: str) -> _FakeSink:
        await trio.lowlevel.checkpoint()
        sink = _FakeSink(self.lanes, name)
        self.sinks.append(sink)
        return sink

    async def commit(self) -> list[SavedFile]:
        await trio.lowlevel.checkpoint()
        base = self.target.dir.replace("~", self.lanes.home, 1)
        saved = []
        for sink in self.sinks:
            k, name = 1, sink.name
            while f"{base}/{name}" in self.lanes.files:
                k += 1
                name = f"{k}-{sink.name}"
            path = f"{base}/{name}"
            self.lanes.files[path] = bytes(sink.data)
            saved.append(SavedFile(sink.name, path, len(sink.data), hashlib.sha256(sink.data).hexdigest()))
        return saved


class _FakeSource:
    def __init__(self, name: str, data: bytes) -> None:
        self.name = name
        self.size = len(data)
        self.sha256 = hashlib.sha256(data).hexdigest()
        self._data = data

    async def chunks(self) -> AsyncIterator[bytes]:
        for i in range(0, len(self._data), 65536):
            await trio.lowlevel.checkpoint()
            yield self._data[i:i + 65536]
