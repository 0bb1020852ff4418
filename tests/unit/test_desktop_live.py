"""The desktop driver's live-view half over a fake QMP and a fake agent: the
lane is measured (not assumed) and the host lane marks the pointer where the
host last moved it; change notices come from a ``damage_watch`` that is
stopped when the view leaves."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pytest
import trio
from PIL import Image

from rigd.backends.desktop import DesktopDriver
from rigd.frames import MARK_FILL, Changes
from rigd.protocols import input as qin
from rigd.protocols.guest import DamageNotice, Stream
from tests.unit.test_desktop_machine import FakeGuest, _jpeg, make

pytestmark = pytest.mark.timeout(20)


def _ppm(w: int, h: int) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (w, h), (200, 200, 200)).save(out, "PPM")
    return out.getvalue()




class SlowGuest(FakeGuest):
    """An agent whose ``screen`` takes ``delay`` seconds; ``damage_watch`` streams what a test feeds it."""

    def __init__(self, answers: dict[str, Any], log: list[tuple[str, Any]], delay: float) -> None:
        super().__init__(answers, log)
        self.delay = delay
        self.watch_stream: Any = None
        self.stopped: list[int] = []

    async def request(self, op: str, *, timeout: float, on_stream: Any = None, **fields: Any) -> dict[str, Any]:
        if op == "screen":
            await trio.sleep(self.delay)
        if op == "damage_stop":
            self.stopped.append(fields["watch"])
            return {"stopped": True}
        return await super().request(op, timeout=timeout, on_stream=on_stream, **fields)

    async def send(self, op: str, *, timeout: float, on_stream: Any = None, on_reply: Any = None,
                   **fields: Any) -> Any:
        assert op == "damage_watch" and fields == {"maxRate": 30}
        self.watch_stream = on_stream
        self.requests.append((op, fields))
        return _Pending(41)


class _Pending:
    def __init__(self, cid: int) -> None:
        self.id = cid
        self.answered = False

    def forget(self) -> None:
        pass


def screen_answer() -> dict[str, Any]:
    import base64
    data = _jpeg(1280, 800)
    return {"displayWidth": 1280, "displayHeight": 800, "imageWidth": 1280, "imageHeight": 800, "scale": 1.0,
            "cursor": [1, 1], "cursorMarked": True, "format": "jpeg", "bytes": len(data),
            "data": base64.b64encode(data).decode()}


def machine(tmp_path: Path, nursery: trio.Nursery, *, agent_delay: float, features: tuple[str, ...]) -> Any:
    m = make(tmp_path, nursery, features=features, frame=_ppm(1280, 800), lane=None)
    m.guest = SlowGuest({"screen": screen_answer()}, [], agent_delay)
    return m


@pytest.mark.parametrize(("agent_delay", "winner"), [(0.5, "qmp"), (0.0, "agent")])
async def test_the_live_lane_is_the_one_measured_faster(tmp_path: Path, agent_delay: float, winner: str) -> None:
    async with trio.open_nursery() as nursery:
        m = machine(tmp_path, nursery, agent_delay=agent_delay, features=("screen", "cursor", "damage"))
        if winner == "agent":
            # the host lane made slow instead: QMP takes 0.5 s
            slow = m.qmp.execute

            async def execute(name: str, arguments: Any = None, *, timeout: float = 10.0) -> Any:
                await trio.sleep(0.5)
                return await slow(name, arguments, timeout=timeout)
            m.qmp.execute = execute
        frame, lane = await m.live_still(max_w=2560, max_h=1600, quality=70)
        assert lane.source == winner == frame.source and set(lane.measured_ms) == {"agent", "qmp"}
        assert lane.why.startswith("measured: ") and " vs " in lane.why
        screens = [op for op, _f in m.guest.requests if op == "screen"]
        dumps = [a for n, a in m.qmp.sent if n == "screendump"]
        assert len(screens) == 2 and len(dumps) == 2 and all(a["format"] == "ppm" for a in dumps)
        # measured once per machine: the next still takes the winner only
        again, same = await m.live_still(max_w=2560, max_h=1600, quality=70)
        assert same is lane and again.source == winner
        assert len([op for op, _f in m.guest.requests if op == "screen"]) == 2 + (winner == "agent")
        assert list(tmp_path.glob("frame-*")) == []


async def test_without_the_agents_screen_the_host_lane_is_the_only_one(tmp_path: Path) -> None:
    async with trio.open_nursery() as nursery:
        m = machine(tmp_path, nursery, agent_delay=0, features=("cursor",))
        _frame, lane = await m.live_still(max_w=2560, max_h=1600, quality=70)
        assert lane.source == "qmp" and set(lane.measured_ms) == {"qmp"} and " vs " not in lane.why


async def test_the_host_lane_marks_the_pointer_where_the_host_moved_it(tmp_path: Path) -> None:
    async with trio.open_nursery() as nursery:
        m = machine(tmp_path, nursery, agent_delay=0.5, features=("screen", "damage"))
        await m.send_input([qin.move(300, 200, 1280, 800)])
        assert m.driver.pointer == (300, 200)
        frame, lane = await m.live_still(max_w=2560, max_h=1600, quality=90)
        assert lane.source == "qmp" and frame.cursor == (300, 200) and frame.cursor_marked
        with Image.open(io.BytesIO(frame.still.data)) as img:
            rgb = img.convert("RGB")
            ring = [rgb.getpixel((300 + dx, 200)) for dx in range(-9, 10)]
            assert any(abs(p[0] - MARK_FILL[0]) + abs(p[1] - MARK_FILL[1]) + abs(p[2] - MARK_FILL[2]) < 90
                       for p in ring)
            assert rgb.getpixel((600, 600)) == pytest.approx((200, 200, 200), abs=3)


@pytest.mark.parametrize("point", [(0, 0), (1279, 799), (640, 400), (1, 798)])
async def test_pointer_moves_are_followed_exactly(tmp_path: Path, point: tuple[int, int]) -> None:
    async with trio.open_nursery() as nursery:
        m = machine(tmp_path, nursery, agent_delay=0, features=())
        await m.send_input([qin.move(*point, 1280, 800)])
        assert m.driver.pointer == point


async def test_damage_notices_and_pointer_moves_reach_the_view_and_the_watch_is_stopped(tmp_path: Path) -> None:
    async with trio.open_nursery() as nursery:
        m = machine(tmp_path, nursery, agent_delay=0, features=("screen", "damage"))
        driver = m.driver
        assert isinstance(driver, DesktopDriver)
        async with m.open_changes() as changes:
            assert isinstance(changes, Changes)
            m.guest.watch_stream(Stream(41, "damage", {"notice": DamageNotice(((1, 2, 3, 4),), 1280, 800)}))
            m.guest.watch_stream(Stream(41, "damage", {"notice": "forged"}))  # not a parsed notice: ignored
            change = await changes.wait()
            assert change is not None and change.why == {"damage"} and change.area == (1, 2, 3, 4)
            await m.send_input([qin.move(10, 10, 1280, 800)])
            change = await changes.wait()
            assert change is not None and change.why == {"pointer"}
        assert m.guest.stopped == [41]
        assert driver._watchers == set()


async def test_an_agent_without_damage_gives_no_notices(tmp_path: Path) -> None:
    async with trio.open_nursery() as nursery:
        m = machine(tmp_path, nursery, agent_delay=0, features=("screen",))
        async with m.open_changes() as changes:
            assert changes is None


async def test_the_screenshot_verb_takes_the_measured_lane_and_marks_the_guests_pointer(tmp_path: Path) -> None:
    import base64

    from tests.unit.test_desktop_machine import action

    async with trio.open_nursery() as nursery:
        m = machine(tmp_path, nursery, agent_delay=0.5, features=("screen", "cursor", "damage"))
        m.guest.answers["cursor"] = {"cursor": [300, 200], "displayWidth": 1280, "displayHeight": 800}
        out = await m.perform(action({"action": "screenshot"}))
        assert out["source"] == "qmp" and out["lane"]["source"] == "qmp"
        assert out["lane"]["why"].startswith("measured: ")
        assert out["cursor"] == [300, 200] and out["cursorMarked"] is True
        with Image.open(io.BytesIO(base64.b64decode(out["image"]["data"]))) as img:
            assert img.format == "JPEG" and img.size == (1280, 800)
            near = [img.convert("RGB").getpixel((x, y)) for x in range(290, 311) for y in range(190, 211)]
        assert any(sum(abs(p[i] - MARK_FILL[i]) for i in range(3)) < 90 for p in near)
        # The live view shares the measurement: nothing is measured again.
        screens = len([op for op, _f in m.guest.requests if op == "screen"])
        _frame, lane = await m.live_still(max_w=2560, max_h=1600, quality=70)
        assert lane.source == "qmp" and len([op for op, _f in m.guest.requests if op == "screen"]) == screens
