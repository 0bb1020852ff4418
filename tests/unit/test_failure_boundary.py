"""Every rig is a failure boundary: whatever one rig's tasks raise (plain or
grouped) fails that rig, with the error in its ``failure``, and never the
manager or another rig. Over the fake backend; tests/integration has the same
with real QEMU."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import trio

from rigd.backends.fake import FakeBackend, FakeMachine
from rigd.errors import BackendError, RigdError, leaves
from rigd.model import Accel, Surface
from rigd.rigs.api import RigApi
from rigd.rigs.failure import describe_failure
from rigd.rigs.manager import Caller, RigManager
from rigd.store.aio import Stores

pytestmark = pytest.mark.timeout(20)


class World:
    def __init__(self, tmp: Path) -> None:
        self.stores = Stores(tmp)
        admin, _ws, _ = self.stores.server.bootstrap()
        self.admin = Caller(admin)
        self.backend = FakeBackend()
        self.rigs = RigManager(self.stores, {Surface.TERMINAL: self.backend}, accel=Accel.TCG,
                               network="gateway")
        self.api = RigApi(self.rigs)
        self.manager_ended = False

    async def open(self) -> tuple[str, FakeMachine]:
        rig = await self.api.call("rig.open", self.admin, {"workspace": "default", "surface": "terminal"})
        return rig["id"], self.backend.machines[-1]

    async def echo(self, rig_id: str) -> str:
        out = await self.api.call("rig.act", self.admin, {"rigId": rig_id, "tool": "terminal_use",
                                               "action": {"action": "exec", "argv": ["echo", "alive"]}})
        text: str = out["stdout"]["text"]
        return text

    async def failed(self, rig_id: str) -> dict[str, Any]:
        live = self.rigs.live[rig_id]
        await live.finished.wait()
        rig = await self.api.call("rig.get", self.admin, {"rigId": rig_id})
        assert rig["phase"] == "failed" and rig["closeReason"] == "backendFailure"
        return rig


@pytest.fixture
async def world(tmp_path: Path) -> AsyncIterator[World]:
    w = World(tmp_path)
    async with trio.open_nursery() as nursery:
        async def manager(task_status: trio.TaskStatus[None]) -> None:
            await w.rigs.run(task_status=task_status)
            w.manager_ended = True

        await nursery.start(manager)
        yield w
        assert not w.manager_ended, "the rig manager ended"
        nursery.cancel_scope.cancel()
    w.stores.close()


async def check_others_fine(w: World, healthy: str) -> None:
    assert await w.echo(healthy) == "alive\n"
    listed = await w.api.call("rig.list", w.admin, {"workspace": "default"})
    assert {r["id"] for r in listed} >= {healthy}
    assert not w.manager_ended


@pytest.mark.parametrize("kind", ["pump", "pump-group"])
async def test_a_machine_task_that_raises_fails_only_its_rig(world: World, kind: str) -> None:
    healthy, _ = await world.open()
    world.backend.fault = kind
    victim, machine = await world.open()
    world.backend.fault = None
    assert await world.echo(victim) == "alive\n"
    machine.fault_now.set()
    rig = await world.failed(victim)
    assert "internal error in the rig's tasks: ValueError: fake pump broke" in rig["failure"]
    if kind == "pump-group":
        assert "(and 1 more error)" in rig["failure"]
    assert rig["consoleTail"] == "fake console\n"
    assert machine.closed
    await check_others_fine(world, healthy)
    # The failed rig can be retried and closed like any failed rig.
    again = await world.api.call("rig.retry", world.admin, {"rigId": victim})
    assert again["phase"] == "ready" and again["retryOf"] == victim


async def test_a_bug_while_coming_up_fails_only_that_rig(world: World) -> None:
    healthy, _ = await world.open()
    world.backend.fault = "restore"
    with pytest.raises(BackendError, match="fake restore bug"):
        await world.open()
    world.backend.fault = None
    failed = [r for r in await world.api.call("rig.list", world.admin, {"workspace": "default"})
              if r["phase"] == "failed"]
    assert len(failed) == 1 and "LookupError" in failed[0]["failure"]
    await check_others_fine(world, healthy)


async def test_a_broken_net_audit_writer_fails_only_its_rig(world: World) -> None:
    healthy, _ = await world.open()
    victim, machine = await world.open()
    assert machine.spec.network is not None
    machine.spec.network.audit(object())  # not a gateway decision: the writer cannot record it
    rig = await world.failed(victim)
    assert "internal error" in rig["failure"] and "TypeError" in rig["failure"]
    assert machine.closed
    await check_others_fine(world, healthy)


async def test_a_failing_progress_write_fails_only_its_rig(world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    healthy, _ = await world.open()

    async def broken(_self: RigManager, _rig: object, _detail: str) -> None:
        raise RuntimeError("progress store broke")

    monkeypatch.setattr(RigManager, "_persist_detail", broken)
    # The write runs beside the boot: the open may see the failure or a ready rig that fails next.
    with contextlib.suppress(RigdError):
        await world.open()
    monkeypatch.undo()
    victim = next(r for r in world.rigs.live.values() if r.row.id != healthy)
    rig = await world.failed(victim.row.id)
    assert "RuntimeError: progress store broke" in rig["failure"]
    await check_others_fine(world, healthy)


async def test_closing_a_rig_is_not_a_failure(world: World) -> None:
    rig_id, machine = await world.open()
    closed = await world.api.call("rig.close", world.admin, {"rigId": rig_id})
    assert closed["phase"] == "closed" and closed["closeReason"] == "requested"
    assert closed["failure"] is None and machine.closed


def test_describe_failure_prefers_rigd_errors_and_counts_the_rest() -> None:
    group = ExceptionGroup("x", [KeyError("k"), ExceptionGroup("y", [BackendError("qmp gone", console="c")])])
    assert [type(e) for e in leaves(group)] == [KeyError, BackendError]
    assert describe_failure(group) == ("qmp gone (and 1 more error)", "c")
    assert describe_failure(OSError(5, "EIO")) == ("host error: [Errno 5] EIO", None)
    text, tail = describe_failure(ValueError("v"), lambda n: "console"[:n])
    assert text == "internal error in the rig's tasks: ValueError: v" and tail == "console"
