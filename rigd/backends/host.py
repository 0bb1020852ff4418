"""The QEMU backend: one :class:`QemuBackend` serves every QEMU surface, each
through its :class:`~rigd.backends.recipe.RecipeSource`.

How a rig comes up (each step is what ``phaseDetail`` says while it runs):

1. The recipe source finds the image (``unpacking image`` / ``checking
   image`` for a terminal pack, ``importing the desktop image`` for a
   desktop) and binds a recipe to it.
2. A plan is computed without I/O (:func:`rigd.backends.recipe.plan_open`):
   warm when the shape has a memory snapshot, else cold.
3. ``opening the egress gateway`` — the rig's gate (:mod:`rigd.backends.gates`).
4. ``creating disk overlay`` — a thin qcow2 over the plan's backing file
   under ``<dataDir>/rigs/run/``, owned by the rig's own uid.
5. ``restoring snapshot`` (warm) or ``booting kernel`` (cold), then ``waiting
   for the guest agent`` and whatever the surface waits for.

A warm start that fails falls back to a cold boot (logged, and the snapshot
is deleted); after the first cold boot of a shape with no snapshot, one is
built in the background (:mod:`rigd.backends.warm`).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import trio

from rigd.backends.base import MachineSpec
from rigd.backends.confine import Identity, UidPool, make_private_dir
from rigd.backends.gates import NetGate, open_gate
from rigd.backends.layout import Layout, remove_files
from rigd.backends.qemu import QemuConfig, QemuMachine, make_overlay, open_qemu_machine
from rigd.backends.recipe import BootRecipe, OpenPlan, RecipeSource, RigPaths, cold_plan, plan_open
from rigd.backends.warm import SnapshotService
from rigd.errors import BackendError, RigdError
from rigd.model import Backend


class QemuBackend:
    def __init__(
        self,
        name: Backend,
        config: QemuConfig,
        recipes: RecipeSource,
        *,
        layout: Layout | None = None,
        uids: UidPool | None = None,
        snapshots: SnapshotService | None = None,
    ) -> None:
        self.name = name
        self.config = config
        self.recipes = recipes
        self.layout = layout or Layout(config.data_dir)
        self.uids = uids or UidPool()
        self.snapshots = snapshots or SnapshotService(config, self.layout, self.uids)
        self.log = logging.getLogger(f"rigd.backend.{name}")

    @asynccontextmanager
    async def open_machine(
        self, spec: MachineSpec, progress: Callable[[str], None]
    ) -> AsyncIterator[QemuMachine]:
        log = logging.getLogger(f"rigd.rig.{spec.rig_id}")
        recipe = await self.recipes.recipe(spec, progress)
        warm = None
        if self.config.warm_starts and recipe.warm_eligible(spec):
            try:
                warm = await self.snapshots.plan(recipe, spec)
            except (OSError, BackendError) as exc:
                log.warning("warm starts unavailable", extra={"reason": str(exc)[:300]})
        plan = plan_open(recipe, warm)
        async with (
            open_gate(self.config.network, spec.rig_id, spec.network, progress) as gateway,
            self.layout.rig_files(spec.rig_id, self.uids) as (paths, identity),
        ):
            if plan.snapshot is not None:
                assert plan.warm is not None
                started = False
                try:
                    async with self._start(spec, recipe, plan, paths, identity, gateway, log,
                                           progress) as machine:
                        started = True
                        await trio.to_thread.run_sync(self.snapshots.restored, plan.warm)
                        yield machine
                    return
                except (BackendError, OSError) as exc:
                    if started:
                        raise
                    reason = exc.message if isinstance(exc, RigdError) else str(exc)
                    log.warning("warm start failed; booting cold",
                                extra={"snapshot": plan.snapshot.key, "reason": reason[:300]})
                    await trio.to_thread.run_sync(self.snapshots.restore_failed, plan.warm, reason)
                    await trio.to_thread.run_sync(remove_files, paths)
                    make_private_dir(paths.rig_dir, identity)
                    plan = cold_plan(recipe, plan.warm)
            async with self._start(spec, recipe, plan, paths, identity, gateway, log,
                                   progress) as machine:
                if plan.warm is not None:  # none yet, or the one there failed to restore (rebuilt once)
                    self.snapshots.schedule(recipe, spec, plan.warm)
                yield machine

    @asynccontextmanager
    async def _start(
        self, spec: MachineSpec, recipe: BootRecipe, plan: OpenPlan, paths: RigPaths,
        identity: Identity, gateway: NetGate | None, log: logging.Logger,
        progress: Callable[[str], None],
    ) -> AsyncIterator[QemuMachine]:
        """Carry out a plan: the overlay, then a restore or a boot, up to a ready surface."""
        progress("creating disk overlay")
        await make_overlay(self.config.qemu_img, paths.overlay, plan.backing, plan.backing_format,
                           identity)
        async with open_qemu_machine(spec=spec, recipe=recipe, config=self.config, identity=identity,
                                     paths=paths, gateway=gateway, log=log) as machine:
            if plan.snapshot is not None:
                progress("restoring snapshot")
                log.info("warm start", extra={"snapshot": plan.snapshot.key})
                await machine.restore(progress, plan.snapshot)
            else:
                progress("booting kernel")
                await machine.boot(progress)
            yield machine
