"""The rig manager over the in-memory fake backend: lifecycle, reuse,
visibility, and the audit log. Real machines are in tests/integration."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import trio
from trio.testing import wait_all_tasks_blocked

from rigd.backends.fake import FakeBackend
from rigd.errors import Conflict, FieldError, NotFound
from rigd.model import Accel, Surface
from rigd.rigs.api import RigApi
from rigd.rigs.manager import Caller, RigManager
from rigd.store.aio import Stores

pytestmark = pytest.mark.timeout(20)


class World:
    def __init__(self, tmp: Path) -> None:
        self.stores = Stores(tmp)
        admin, ws, _ = self.stores.server.bootstrap()
        self.admin = Caller(admin)
        self.ws = ws
        self.outsider = Caller(self.stores.server.create_user("outsider"))
        self.backend = FakeBackend()
        self.rigs = RigManager(self.stores, {Surface.TERMINAL: self.backend}, accel=Accel.TCG)
        self.api = RigApi(self.rigs)


@asynccontextmanager
async def running(w: World) -> AsyncIterator[World]:
    async with trio.open_nursery() as nursery:
        await nursery.start(w.rigs.run)
        yield w
        nursery.cancel_scope.cancel()
    w.stores.close()


@pytest.fixture
async def world(tmp_path: Path) -> AsyncIterator[World]:
    async with running(World(tmp_path)) as w:
        yield w


async def test_open_exec_close_keeps_audit_rows(world: World) -> None:
    rig = await world.api.call("rig.open", world.admin, {"workspace": "default", "surface": "terminal"})
    assert rig["phase"] == "ready" and rig["accel"] == "tcg" and rig["securityBoundary"] is False
    assert any("not a security boundary" in n for n in rig["notes"])
    result = await world.api.call("rig.act", world.admin, {
        "rigId": rig["id"], "tool": "terminal_use",
        "action": {"action": "exec", "argv": ["echo", "hi"]},
    })
    assert result["exitCode"] == 0 and result["stdout"]["text"] == "hi\n"
    assert result["stdout"]["untrusted"] is True
    closed = await world.api.call("rig.close", world.admin, {"rigId": rig["id"]})
    assert closed["phase"] == "closed" and closed["closeReason"] == "requested"
    assert world.backend.machines[0].closed
    log = await world.api.call("rig.log", world.admin, {"rigId": rig["id"]})
    assert [(a["tool"], a["verb"], a["outcome"]) for a in log] == [
        ("rig", "open", "ok"), ("terminal_use", "exec", "ok"), ("rig", "close", "ok")]
    assert [a["seq"] for a in log] == [1, 2, 3]
    listed = await world.api.call("rig.list", world.admin, {"workspace": "default", "includeClosed": True})
    assert [r["id"] for r in listed] == [rig["id"]]


async def test_typed_text_is_masked_in_the_audit_log(world: World) -> None:
    rig = await world.api.call("rig.open", world.admin, {"workspace": "default", "surface": "terminal"})
    secret = "hunter2-super-secret"
    await world.api.call("rig.act", world.admin, {
        "rigId": rig["id"], "tool": "terminal_use",
        "action": {"action": "exec", "argv": ["cat"], "stdin": secret, "env": {"TOKEN": secret}},
    })
    log = await world.api.call("rig.log", world.admin, {"rigId": rig["id"]})
    dumped = json.dumps(log)
    assert secret not in dumped
    exec_row = log[-1]
    assert exec_row["args"]["stdin"]["len"] == len(secret)
    assert len(exec_row["args"]["stdin"]["sha256"]) == 64
    db_bytes = (world.stores.data_dir / "workspaces" / f"{world.ws.id}.db").read_bytes()
    assert secret.encode() not in db_bytes


async def test_malformed_action_names_the_field_and_is_logged(world: World) -> None:
    rig = await world.api.call("rig.open", world.admin, {"workspace": "default", "surface": "terminal"})
    with pytest.raises(FieldError) as exc:
        await world.api.call("rig.act", world.admin, {"rigId": rig["id"], "tool": "terminal_use",
                                           "action": {"action": "exec", "argv": [], "timeoutS": 5}})
    assert exc.value.field.startswith("action.")
    with pytest.raises(FieldError) as exc:
        await world.api.call("rig.act", world.admin, {"rigId": rig["id"], "tool": "computer_use",
                                           "action": {"action": "screenshot"}})
    assert exc.value.field == "tool"
    log = await world.api.call("rig.log", world.admin, {"rigId": rig["id"]})
    assert [a["outcome"] for a in log[1:]] == ["error", "error"]


async def test_conversation_reuses_its_terminal(world: World) -> None:
    a = await world.api.call("rig.open", world.admin, {"workspace": "default", "surface": "terminal",
                                            "conversation": "c1"})
    b = await world.api.call("rig.open", world.admin, {"workspace": "default", "surface": "terminal",
                                            "conversation": "c1"})
    c = await world.api.call("rig.open", world.admin, {"workspace": "default", "surface": "terminal",
                                            "conversation": "c2"})
    assert a["id"] == b["id"] != c["id"]
    assert len(world.backend.machines) == 2


async def test_outsiders_cannot_tell_a_rig_exists(world: World) -> None:
    rig = await world.api.call("rig.open", world.admin, {"workspace": "default", "surface": "terminal"})
    errors = []
    for call in (
        world.api.call("rig.get", world.outsider, {"rigId": rig["id"]}),
        world.api.call("rig.close", world.outsider, {"rigId": rig["id"]}),
        world.api.call("rig.act", world.outsider, {"rigId": rig["id"], "tool": "terminal_use",
                                        "action": {"action": "exec", "argv": ["echo"]}}),
        world.api.call("rig.get", world.outsider, {"rigId": "rig_doesnotexist"}),
    ):
        with pytest.raises(NotFound) as exc:
            await call
        errors.append(exc.value.to_json())
    # A foreign rig and a missing one get the same shape of answer.
    assert {e["code"] for e in errors} == {NotFound.code}
    assert errors[0]["data"] == errors[3]["data"] == {"field": "rigId"}
    with pytest.raises(NotFound):
        await world.api.call("rig.list", world.outsider, {"workspace": "default"})
    assert (await world.api.call("rig.get", world.admin, {"rigId": rig["id"]}))["phase"] == "ready"


async def test_machine_death_marks_failed_backend_failure(world: World) -> None:
    rig = await world.api.call("rig.open", world.admin, {"workspace": "default", "surface": "terminal"})
    world.backend.machines[0].died.set()
    with trio.fail_after(5):
        while (await world.api.call("rig.get", world.admin, {"rigId": rig["id"]}))["phase"] != "failed":
            await trio.sleep(0.01)
    got = await world.api.call("rig.get", world.admin, {"rigId": rig["id"]})
    assert got["closeReason"] == "backendFailure" and "died" in got["failure"]
    with pytest.raises(Conflict):
        await world.api.call("rig.act", world.admin, {"rigId": rig["id"], "tool": "terminal_use",
                                           "action": {"action": "exec", "argv": ["echo"]}})
    closed = await world.api.call("rig.close", world.admin, {"rigId": rig["id"]})
    assert closed["phase"] == "closed" and closed["closeReason"] == "backendFailure"


async def test_boot_failure_is_failed_with_reason(world: World) -> None:
    world.backend.fail_boot = "kernel panic"
    with pytest.raises(Exception, match="kernel panic"):
        await world.api.call("rig.open", world.admin, {"workspace": "default", "surface": "terminal"})
    rigs = await world.api.call("rig.list", world.admin, {"workspace": "default"})
    assert rigs[0]["phase"] == "failed" and rigs[0]["failure"] == "kernel panic"


async def test_phase_detail_names_the_step(world: World) -> None:
    world.backend.boot_gate = trio.Event()
    rig = await world.api.call("rig.open", world.admin, {"workspace": "default", "surface": "terminal",
                                              "wait": False})
    assert rig["phase"] == "provisioning"
    await wait_all_tasks_blocked()
    got = await world.api.call("rig.get", world.admin, {"rigId": rig["id"]})
    assert got["phaseDetail"] == "booting kernel"
    world.backend.boot_gate.set()


async def test_shutdown_closes_with_server_shutdown(world: World) -> None:
    rig = await world.api.call("rig.open", world.admin, {"workspace": "default", "surface": "terminal"})
    await world.rigs.shutdown()
    got = await world.api.call("rig.get", world.admin, {"rigId": rig["id"]})
    assert got["phase"] == "closed" and got["closeReason"] == "serverShutdown"


@pytest.fixture
async def desk_world(tmp_path: Path) -> AsyncIterator[World]:
    w = World(tmp_path)
    w.rigs.backends[Surface.COMPUTER] = w.backend
    async with running(w):
        yield w


async def test_a_computer_rig_runs_on_the_servers_accelerator(desk_world: World) -> None:
    w = desk_world
    rig = await w.api.call("rig.open", w.admin, {"workspace": "default", "surface": "computer"})
    assert rig["backend"] == "qemu-tcg" and rig["display"] == {"width": 1280, "height": 800}
    spec = w.backend.machines[-1].spec
    assert spec.accel is Accel.TCG and spec.display == (1280, 800)
    assert rig["execImage"] is False
    named = await w.api.call("rig.open", w.admin, {"workspace": "default", "surface": "computer",
                                        "backend": "qemu-tcg", "display": {"width": 1920, "height": 1080}})
    assert w.backend.machines[-1].spec.display == (1920, 1080) and named["backend"] == "qemu-tcg"


@pytest.mark.parametrize(
    ("params", "field", "words"),
    [
        ({"backend": "qemu-kvm"}, "backend", "needs kvm"),
        ({"backend": "qemu-hvf"}, "backend", "needs hvf"),
        ({"backend": "smolvm"}, "backend", "runs on"),
        ({"display": {"width": 320, "height": 240}}, "display", "at least 640x480"),
    ],
)
async def test_computer_open_refusals_name_the_field(
    desk_world: World, params: dict[str, object], field: str, words: str
) -> None:
    with pytest.raises(FieldError) as exc:
        await desk_world.api.call("rig.open", desk_world.admin, {"workspace": "default", "surface": "computer", **params})
    assert exc.value.field == field and words in exc.value.message
    assert desk_world.backend.machines == []


async def test_a_new_mode_in_a_result_moves_the_coordinate_bounds(desk_world: World) -> None:
    w = desk_world
    rig = await w.api.call("rig.open", w.admin, {"workspace": "default", "surface": "computer"})
    machine = w.backend.machines[-1]
    machine.answers["set_display"] = {"display": {"width": 1920, "height": 1080}, "changed": True}
    await w.api.call("rig.act", w.admin, {"rigId": rig["id"], "tool": "computer_use",
                               "action": {"action": "set_display", "width": 1920, "height": 1080}})
    assert (await w.api.call("rig.get", w.admin, {"rigId": rig["id"]}))["display"] == {"width": 1920, "height": 1080}
    await w.api.call("rig.act", w.admin, {"rigId": rig["id"], "tool": "computer_use",
                               "action": {"action": "mouse_move", "coordinate": [1900, 1000]}})
    with pytest.raises(FieldError) as exc:
        await w.api.call("rig.act", w.admin, {"rigId": rig["id"], "tool": "computer_use",
                                   "action": {"action": "mouse_move", "coordinate": [1920, 10]}})
    assert exc.value.field == "action.coordinate" and "1920x1080" in exc.value.message


async def test_conversation_reuses_its_browser_per_engine_and_never_its_terminal(tmp_path: Path) -> None:
    w = World(tmp_path)
    w.rigs.backends[Surface.BROWSER] = w.backend
    async with running(w):
        def open_(surface: str, **extra: str) -> dict[str, str]:
            return {"workspace": "default", "surface": surface, "conversation": "c1", **extra}

        a = await w.api.call("rig.open", w.admin, open_("browser"))
        b = await w.api.call("rig.open", w.admin, open_("browser", engine="chromium"))
        t = await w.api.call("rig.open", w.admin, open_("terminal"))
        assert a["id"] == b["id"] != t["id"] and a["engine"] == "chromium"
        f = await w.api.call("rig.open", w.admin, open_("browser", engine="firefox"))
        assert f["id"] not in (a["id"], t["id"]) and f["engine"] == "firefox"
        assert (await w.api.call("rig.open", w.admin, open_("browser", engine="firefox")))["id"] == f["id"]
        k = await w.api.call("rig.open", w.admin, open_("browser", engine="webkit"))
        assert k["id"] not in (a["id"], f["id"], t["id"]) and k["engine"] == "webkit"
        with pytest.raises(FieldError) as exc:
            await w.api.call("rig.open", w.admin, open_("browser", engine="edge"))
        assert exc.value.field == "engine"
        await w.api.call("rig.close", w.admin, {"rigId": a["id"]})
        assert (await w.api.call("rig.get", w.admin, {"rigId": f["id"]}))["phase"] == "ready"
        c = await w.api.call("rig.open", w.admin, open_("browser"))
        assert c["id"] != a["id"]
        # The terminal was left alone by the browser's close.
        assert (await w.api.call("rig.get", w.admin, {"rigId": t["id"]}))["phase"] == "ready"
