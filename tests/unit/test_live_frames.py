"""The live view's frame loop (:func:`rigd.server.live.changed_frames`) over a
fake machine, and the change notices it waits on (:class:`rigd.frames.Changes`).

With notices, the loop grabs once when the view opens and then only after a
notice: an idle screen costs no grab, a flood of notices costs at most one
grab per ``MIN_FRAME_INTERVAL_S``. Without them (an older agent) it polls.
Time is trio's MockClock (autojump), so "idle for a minute" takes no time.
"""

from __future__ import annotations

import contextlib
import itertools

import pytest
import trio
import trio.testing

from rigd.backends.base import MachineInfo, MachineSpec
from rigd.backends.fake import FakeDesktopMachine
from rigd.frames import Changes, LiveScreen, union
from rigd.model import Accel, Backend, Surface
from rigd.server.live import MIN_FRAME_INTERVAL_S, LiveFrame, changed_frames, frame_fields

pytestmark = pytest.mark.timeout(20)


def desktop(*, notices: bool) -> FakeDesktopMachine:
    spec = MachineSpec(rig_id="rig_live", surface=Surface.COMPUTER, memory_mb=2048, vcpus=2)
    info = MachineInfo(backend=Backend.QEMU_TCG, accel=Accel.TCG, pid=None, pid_start_ticks=None, image=None)
    return FakeDesktopMachine(spec=spec, info=info, notices=notices)


class Viewer:
    """Runs the loop in a task; frames land in ``frames`` with the (mock) time they came."""

    def __init__(self, machine: FakeDesktopMachine) -> None:
        self.machine = machine
        self.frames: list[tuple[float, LiveFrame]] = []
        self.ticks = 0
        self.arrived = trio.Event()

    def _tick(self) -> None:
        self.ticks += 1

    async def run(self) -> None:
        live = changed_frames(self.machine, self._tick)
        async with contextlib.aclosing(live):
            async for frame in live:
                self.frames.append((trio.current_time(), frame))
                self.arrived.set()
                self.arrived = trio.Event()

    async def next_frame(self, within: float) -> LiveFrame:
        with trio.fail_after(within):
            await self.arrived.wait()
        return self.frames[-1][1]


def test_the_fake_offers_the_live_screen() -> None:
    assert isinstance(desktop(notices=True), LiveScreen)


async def test_an_idle_screen_costs_no_grab_and_a_change_yields_a_frame_promptly(
        autojump_clock: trio.testing.MockClock) -> None:
    m = desktop(notices=True)
    v = Viewer(m)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(v.run)
        first = await v.next_frame(within=1)
        assert first.trigger == "open" and first.grabs == 1 and first.lane is not None
        await trio.sleep(60)  # a minute of an idle screen
        assert m.grabs == 1 and len(v.frames) == 1 and v.ticks == 1
        t0 = trio.current_time()
        m.change()
        frame = await v.next_frame(within=1)
        assert frame.trigger == "damage" and frame.grabs == 2
        assert v.frames[-1][0] - t0 <= MIN_FRAME_INTERVAL_S
        nursery.cancel_scope.cancel()
    assert m.watchers == []  # leaving the loop ended the watch


async def test_a_flood_of_notices_is_coalesced_and_rate_capped(autojump_clock: trio.testing.MockClock) -> None:
    m = desktop(notices=True)
    m.grab_s = 0.01
    v = Viewer(m)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(v.run)
        await v.next_frame(within=1)
        t0 = trio.current_time()
        for _ in range(1000):  # a thousand notices in one go: a hostile or very busy guest
            m.change([(0, 0, 5, 5), (100, 100, 5, 5)])
        await v.next_frame(within=1)
        await trio.sleep(5)
        assert m.grabs == 2  # one grab took them all
        assert m.watchers == [] or not m.watchers[0].pending

        # A notice every millisecond for two seconds: frames at most every MIN_FRAME_INTERVAL_S.
        start_grabs = m.grabs
        t0 = trio.current_time()
        while trio.current_time() - t0 < 2.0:
            m.change()
            await trio.sleep(0.001)
        await trio.sleep(1)
        grabs = m.grabs - start_grabs
        assert 2.0 / (MIN_FRAME_INTERVAL_S + 0.01) - 3 <= grabs <= 2.0 / MIN_FRAME_INTERVAL_S + 2
        times = [t for t, _f in v.frames[2:]]
        gaps = [b - a for a, b in itertools.pairwise(times)]
        assert min(gaps) >= MIN_FRAME_INTERVAL_S - 1e-9
        nursery.cancel_scope.cancel()


async def test_a_pointer_move_wakes_the_view(autojump_clock: trio.testing.MockClock) -> None:
    m = desktop(notices=True)
    v = Viewer(m)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(v.run)
        await v.next_frame(within=1)
        m.version += 1  # the pointer mark moved: new pixels, no X damage
        m.watchers[0].pointer()
        frame = await v.next_frame(within=1)
        assert frame.trigger == "pointer"
        nursery.cancel_scope.cancel()


async def test_an_unchanged_grab_is_not_sent(autojump_clock: trio.testing.MockClock) -> None:
    m = desktop(notices=True)
    v = Viewer(m)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(v.run)
        await v.next_frame(within=1)
        m.watchers[0].damage([(0, 0, 1, 1)])  # damage that left the same pixels
        await trio.sleep(1)
        assert m.grabs == 2 and len(v.frames) == 1
        nursery.cancel_scope.cancel()


async def test_an_ended_watch_is_opened_again(autojump_clock: trio.testing.MockClock) -> None:
    m = desktop(notices=True)
    v = Viewer(m)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(v.run)
        await v.next_frame(within=1)
        old = m.watchers[0]
        old.end()  # the agent (or X) restarted
        await trio.sleep(2)
        assert len(m.watchers) == 1 and m.watchers[0] is not old
        m.change()
        assert (await v.next_frame(within=2)).trigger == "damage"
        nursery.cancel_scope.cancel()


async def test_a_watch_that_keeps_ending_at_once_gives_way_to_polling(
        autojump_clock: trio.testing.MockClock) -> None:
    m = desktop(notices=True)
    v = Viewer(m)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(v.run)
        ended: list[Changes] = []
        for _ in range(3):  # refused, as by an X server without DAMAGE
            while not m.watchers or m.watchers[0] in ended:
                await trio.sleep(0.1)
            ended.append(m.watchers[0])
            m.watchers[0].end()
        await trio.sleep(5)
        assert m.watchers == []  # given up: no fourth watch
        m.version += 1  # the screen changes; only polling can see it now
        await trio.sleep(1)
        nursery.cancel_scope.cancel()
    assert v.frames[-1][1].trigger == "poll"


async def test_without_notices_the_screen_is_polled(autojump_clock: trio.testing.MockClock) -> None:
    m = desktop(notices=False)  # the fake's screen is new at every grab
    v = Viewer(m)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(v.run)
        await trio.sleep(1)
        nursery.cancel_scope.cancel()
    assert len(v.frames) >= 10 and all(f.trigger == "poll" for _t, f in v.frames)
    assert frame_fields(v.frames[0][1]) == {"trigger": "poll", "grabs": 1}


async def test_frame_fields_name_the_lane_and_why(autojump_clock: trio.testing.MockClock) -> None:
    m = desktop(notices=True)
    v = Viewer(m)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(v.run)
        fields = frame_fields(await v.next_frame(within=1))
        nursery.cancel_scope.cancel()
    assert fields == {"trigger": "open", "grabs": 1, "lane": {
        "source": "fake", "why": "measured: the fake's only lane", "measuredMs": {"fake": 0.0}}}


async def test_changes_take_everything_at_once() -> None:
    c = Changes()
    c.damage([(10, 10, 5, 5)])
    c.damage([(0, 20, 2, 2), (30, 0, 1, 1)])
    c.pointer()
    change = await c.wait()
    assert change is not None and change.why == {"damage", "pointer"} and change.notices == 2
    assert change.area == (0, 0, 31, 22)
    assert not c.pending and c.received == 2
    c.end()
    assert await c.wait() is None


def test_union() -> None:
    assert union(None, []) is None
    assert union((5, 5, 1, 1), [(0, 0, 2, 2)]) == (0, 0, 6, 6)
