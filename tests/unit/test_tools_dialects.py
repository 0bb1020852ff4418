"""tools.list / tools.call in each dialect, over the rig manager and the in-memory
fake backend: what runs on the rig (its audit log), what comes back, and the
refusals a model reads. terminal_use with rigId runs on that rig."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import trio

from rigd.backends.fake import FakeBackend, FakeMachine
from rigd.errors import FieldError, NotFound
from rigd.model import Accel, Surface
from rigd.rigs.api import RigApi
from rigd.rigs.manager import Caller, RigManager
from rigd.store.aio import Stores
from rigd.tools.catalogue import Tools, definitions, metadata

pytestmark = pytest.mark.timeout(20)


class World:
    def __init__(self, tmp: Path) -> None:
        self.stores = Stores(tmp)
        admin, _ws, _ = self.stores.server.bootstrap()
        self.admin = Caller(admin)
        self.outsider = Caller(self.stores.server.create_user("outsider"))
        self.backend = FakeBackend()
        self.rigs = RigManager(self.stores, {s: self.backend for s in (Surface.TERMINAL, Surface.COMPUTER,
                                                                       Surface.BROWSER)}, accel=Accel.TCG)
        self.api = RigApi(self.rigs)
        self.tools = Tools(self.api)

    async def open(self, surface: str, **extra: Any) -> tuple[str, FakeMachine]:
        rig = await self.api.call("rig.open", self.admin, {"workspace": "default", "surface": surface,
                                                           "conversation": "c1", **extra})
        machine = self.backend.machines[-1]
        w, h = rig["display"]["width"], rig["display"]["height"]
        scale = max(w / 1280, h / 800, 1.0)
        machine.answers["screenshot"] = {
            "image": {"mediaType": "image/jpeg", "data": "AAAA"}, "display": {"width": w, "height": h},
            "imageSize": {"width": round(w / scale), "height": round(h / scale)}, "scale": scale,
            "cursor": [w // 2, h // 2]}
        machine.answers["cursor_position"] = {"coordinate": [w // 2, h // 2], "display": {"width": w, "height": h}}
        return rig["id"], machine

    async def call(self, name: str, arguments: object, dialect: str | None = None,
                   caller: Caller | None = None) -> dict[str, Any]:
        params: dict[str, Any] = {"workspace": "default", "conversation": "c1", "name": name,
                                  "arguments": arguments}
        if dialect is not None:
            params["dialect"] = dialect
        with trio.fail_after(10):
            return await self.tools.call(caller or self.admin, params)

    async def log(self, rig_id: str) -> list[tuple[str, Any]]:
        rows = await self.api.call("rig.log", self.admin, {"rigId": rig_id})
        return [(r["verb"], r["args"].get("coordinate")) for r in rows if r["tool"] != "rig"]


@pytest.fixture
async def world(tmp_path: Path) -> AsyncIterator[World]:
    w = World(tmp_path)
    async with trio.open_nursery() as nursery:
        await nursery.start(w.rigs.run)
        yield w
        nursery.cancel_scope.cancel()
    w.stores.close()


async def test_the_default_listing_is_unchanged_and_an_unknown_dialect_is_refused(world: World) -> None:
    assert await world.tools.list(world.admin, {}) == {"tools": definitions(), "metadata": metadata()}
    assert await world.tools.list(world.admin, {"dialect": "openai"}) == await world.tools.list(world.admin, None)
    for params, field in (({"dialect": "claude"}, "dialect"), ({"anthropicTool": "computer_2024"}, "anthropicTool"),
                          ({"rigId": "rig_x"}, "rigId"), ({"dialects": "gemini"}, "dialects"),
                          ({"dialect": "gemini", "anthropicTool": "computer_20251124"}, "anthropicTool")):
        with pytest.raises(FieldError) as exc:
            await world.tools.list(world.admin, params)
        assert exc.value.field == field


async def test_a_vendor_listing_is_sized_to_the_rigs_screenshots(world: World) -> None:
    rig_id, _ = await world.open("computer", display={"width": 2560, "height": 1600})
    listed = await world.tools.list(world.admin, {"dialect": "anthropic", "rigId": rig_id})
    computer = next(t for t in listed["tools"] if t["name"] == "computer")
    assert (computer["display_width_px"], computer["display_height_px"]) == (1280, 800)
    assert listed["frame"] == {"display": {"width": 2560, "height": 1600}, "image": {"width": 1280, "height": 800},
                               "scale": 2.0}
    assert listed["metadata"]["computer"] == metadata()["computer_use"]
    assert "computer_use" not in listed["metadata"]
    gemini = await world.tools.list(world.admin, {"dialect": "gemini"})
    assert gemini["metadata"]["click_at"] == metadata()["browser_use"]
    with pytest.raises(NotFound):  # a stranger's rig cannot size anything
        await world.tools.list(world.outsider, {"dialect": "anthropic", "rigId": rig_id})


async def test_anthropic_clicks_where_it_means_on_a_downscaled_display(world: World) -> None:
    rig_id, _ = await world.open("computer", display={"width": 2560, "height": 1600})
    out = await world.call("computer", {"action": "left_click", "coordinate": [640, 400]}, "anthropic")
    assert out["isError"] is False and out["rigId"] == rig_id
    image, text = out["content"]
    assert image["type"] == "image" and "scale 2.0" in text["text"] and "Pointer at 640,400" in text["text"]
    assert await world.log(rig_id) == [("left_click", [1280, 800]), ("screenshot", None)]
    where = await world.call("computer", {"action": "cursor_position"}, "anthropic")
    assert where["content"][0]["text"].startswith("X=640,Y=400")


async def test_openai_computer_runs_a_batch_then_one_screenshot(world: World) -> None:
    rig_id, _ = await world.open("computer")
    out = await world.call("computer", {"actions": [
        {"type": "click", "button": "left", "x": 10, "y": 20},
        {"type": "type", "text": "hello"},
        {"type": "keypress", "keys": ["CTRL", "S"]},
    ]}, "openai-computer")
    assert out["isError"] is False, out
    assert out["content"][1]["text"].startswith("click, type, keypress: done.")
    assert await world.log(rig_id) == [("left_click", [10, 20]), ("type", None), ("key", None),
                                       ("screenshot", None)]


async def test_a_batch_with_a_bad_action_runs_nothing(world: World) -> None:
    rig_id, _ = await world.open("computer")
    out = await world.call("computer", {"actions": [{"type": "click", "button": "left", "x": 1, "y": 1},
                                                    {"type": "move", "x": 1280, "y": 1}]}, "openai-computer")
    assert out["isError"] is True
    assert "arguments.actions[1].x" in out["content"][0]["text"] and "outside the screenshot" in out["content"][0]["text"]
    assert await world.log(rig_id) == []


async def test_gemini_drives_the_conversations_browser_in_its_grid(world: World) -> None:
    rig_id, _ = await world.open("browser")
    out = await world.call("click_at", {"x": 500, "y": 500}, "gemini")
    assert out["isError"] is False and out["rigId"] == rig_id
    assert "0-999 of this image" in out["content"][1]["text"]
    assert await world.log(rig_id) == [("click", [640, 400]), ("screenshot", None)]
    machine = world.backend.machines[-1]
    machine.answers["navigate"] = {"url": "https://example.test/landed", "status": 200}
    went = await world.call("navigate", {"url": "example.test"}, "gemini")
    assert went["isError"] is False and went["url"] == "https://example.test/landed"
    assert [verb for verb, _ in await world.log(rig_id)][-2:] == ["navigate", "screenshot"]


async def test_wrong_dialect_shapes_and_names_are_readable_errors(world: World) -> None:
    rig_id, _ = await world.open("computer")
    cases = [
        ("computer", {"action": "left_click", "coordinate": [1, 1]}, "klingon", "dialect:"),
        ("computer_use", {"action": "screenshot"}, "anthropic", "name: 'computer_use' is not a tool"),
        ("computer", {"action": "left_click", "x": 1, "y": 1}, "anthropic", "arguments.x:"),
        ("computer", {"action": "left_click", "coordinate": [1, 1]}, "openai-computer", "arguments.coordinate:"),
        ("computer", "{not json", "anthropic", "arguments: is not valid JSON"),
        ("click_at", {"x": 1, "y": 1, "rigId": rig_id}, "gemini", "arguments.rigId:"),  # a computer rig
    ]
    for name, args, dialect, words in cases:
        out = await world.call(name, args, dialect)
        assert out["isError"] is True and words in out["content"][0]["text"], (dialect, out)
    assert await world.log(rig_id) == []


async def test_terminal_use_runs_on_the_rig_it_names(world: World) -> None:
    rig_id, machine = await world.open("computer")
    out = await world.call("terminal_use", {"action": "exec", "argv": ["echo", "desk"], "rigId": rig_id,
                                            "user": "root"})
    assert out["isError"] is False and out["rigId"] == rig_id and "desk" in out["content"][0]["text"]
    assert machine.calls == [["echo", "desk"]]
    # The same through a vendor dialect: rigd's own tools are served as they are.
    out = await world.call("terminal_use", {"action": "exec", "argv": ["echo", "again"], "rigId": rig_id,
                                            "user": "root"}, "anthropic")
    assert out["isError"] is False and machine.calls[-1] == ["echo", "again"]
    # Without user, a computer rig runs it as its desktop's user, in its session.
    await world.call("terminal_use", {"action": "exec", "argv": ["echo", "mine"], "rigId": rig_id})
    wrapped = machine.calls.pop()
    assert wrapped[:2] == ["bash", "-c"] and wrapped[3:] == ["rigd-session", "rig", "--", "echo", "mine"]
    # Without rigId: the conversation's terminal, a rig of its own.
    own = await world.call("terminal_use", {"action": "exec", "argv": ["echo", "term"]})
    assert own["isError"] is False and own["rigId"] != rig_id
    for args, caller in (({"rigId": rig_id}, world.outsider), ({"rigId": "rig_nope"}, world.admin),
                         ({"rigId": 7}, world.admin)):
        bad = await world.call("terminal_use", {"action": "exec", "argv": ["echo", "x"], **args}, caller=caller)
        assert bad["isError"] is True, bad
    assert machine.calls == [["echo", "desk"], ["echo", "again"]]
