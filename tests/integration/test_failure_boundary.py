"""Every rig is a failure boundary, with real QEMU: a bug in one running
machine's own tasks — its QMP reader, its guest-channel reader, its console
pump — fails that rig (``failed``, ``backendFailure``, the error and the
console tail in ``failure``), while a second rig keeps answering ``exec``,
``rig.list`` answers throughout and the manager keeps running.

The rig manager runs in-process over the real terminal backend so the test
can plant the fault in one machine's task; tests/unit/test_failure_boundary.py
covers the same (plus the net-audit writer, progress and restores) over the
fake backend.
"""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import pytest
import trio

from rigd.backends.qemu import QemuConfig, QemuMachine
from rigd.backends.smolvm import terminal_backend
from rigd.images import find_assets
from rigd.model import Accel, Surface
from rigd.rigs.api import RigApi
from rigd.rigs.manager import Caller, RigManager
from rigd.server.main import publish_assets, readable_pack
from rigd.store.aio import Stores

from .conftest import make_data_dir, reap

pytestmark = [pytest.mark.vm, pytest.mark.timeout(600)]


@dataclass
class World:
    rigs: RigManager
    api: RigApi
    admin: Caller
    ended: list[str]

    async def open(self) -> str:
        rig = await self.api.call("rig.open", self.admin, {"workspace": "default", "surface": "terminal"})
        assert rig["phase"] == "ready", rig
        return str(rig["id"])

    def machine(self, rig_id: str) -> QemuMachine:
        machine = self.rigs.live[rig_id].machine
        assert isinstance(machine, QemuMachine)
        return machine

    async def echo(self, rig_id: str, word: str = "alive") -> dict[str, Any]:
        out: dict[str, Any] = await self.api.call("rig.act", self.admin, {
            "rigId": rig_id, "tool": "terminal_use",
            "action": {"action": "exec", "argv": ["/bin/sh", "-c", f"echo {word}"]}})
        return out


@pytest.fixture
async def world() -> AsyncIterator[World]:
    data_dir = make_data_dir()
    stores = Stores(data_dir)
    try:
        admin, _ws, _ = stores.server.bootstrap()
        assets = publish_assets(find_assets(), data_dir)
        backend = terminal_backend(QemuConfig(data_dir=data_dir, accel=Accel.TCG, warm_starts=False),
                                   assets, lambda progress: readable_pack(assets, data_dir, progress))
        rigs = RigManager(stores, {Surface.TERMINAL: backend}, accel=Accel.TCG,
                          recover=backend.layout.recover)
        w = World(rigs, RigApi(rigs), Caller(admin), [])
        async with trio.open_nursery() as nursery:
            async def manager(task_status: trio.TaskStatus[None]) -> None:
                await rigs.run(task_status=task_status)
                w.ended.append("the rig manager returned")

            await nursery.start(manager)
            yield w
            assert not w.ended
            nursery.cancel_scope.cancel()
    finally:
        stores.close()
        leaked = reap(data_dir)
        shutil.rmtree(data_dir, ignore_errors=True)
        assert not leaked, f"QEMU processes outlived the test: {leaked}"


def boom(what: str) -> Callable[..., None]:
    def raise_(*_args: object) -> None:
        raise RuntimeError(f"planted fault in the {what}")

    return raise_


async def plant_qmp_reader(m: QemuMachine) -> None:
    assert m.qmp is not None
    m.qmp._dispatch = boom("QMP reader")  # type: ignore[method-assign]
    with contextlib.suppress(Exception):  # the reply never arrives: the reader is gone
        await m.qmp.execute("query-status", timeout=5)


async def plant_guest_reader(m: QemuMachine) -> None:
    assert m.guest is not None
    m.guest._dispatch = boom("guest reader")  # type: ignore[method-assign]
    with contextlib.suppress(Exception):
        await m.exec(["true"], cwd=None, env=None, stdin=None, timeout_s=5, max_output=64)


async def plant_console(m: QemuMachine) -> None:
    m.console.feed = boom("console pump")  # type: ignore[method-assign]
    with contextlib.suppress(Exception):
        await m.exec(["/bin/sh", "-c", "echo rigd-fault > /dev/console"], cwd=None, env=None,
                     stdin=None, timeout_s=20, max_output=64)


@pytest.mark.parametrize("what, plant", [
    ("QMP reader", plant_qmp_reader),
    ("guest reader", plant_guest_reader),
    ("console pump", plant_console),
])
async def test_a_machine_task_that_raises_fails_only_its_rig(
    world: World, what: str, plant: Callable[[QemuMachine], Any],
) -> None:
    healthy = await world.open()
    victim = await world.open()
    machine = world.machine(victim)
    await plant(machine)
    with trio.fail_after(60):
        await world.rigs.live[victim].finished.wait()
    rig = await world.api.call("rig.get", world.admin, {"rigId": victim})
    assert rig["phase"] == "failed" and rig["closeReason"] == "backendFailure", rig
    assert f"RuntimeError: planted fault in the {what}" in rig["failure"]
    assert rig["consoleTail"], "the failure keeps the console tail"
    assert machine.proc is not None and machine.proc.returncode is not None, "its QEMU is gone"
    # The other rig, the list and the manager are untouched.
    out = await world.echo(healthy)
    assert out["exitCode"] == 0 and out["stdout"]["text"] == "alive\n"
    listed = await world.api.call("rig.list", world.admin, {"workspace": "default"})
    assert {r["id"]: r["phase"] for r in listed} == {healthy: "ready", victim: "failed"}
    assert not world.ended
