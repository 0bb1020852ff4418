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

A fork's copy (``MachineSpec.fork``, :meth:`QemuBackend.freeze`) takes a copy of the
frozen parent's disk overlay instead of step 4 and restores the parent's RAM in
step 5; it never falls back to a boot.

A warm start that fails falls back to a cold boot (logged, and the snapshot
is deleted); after the first cold boot of a shape with no snapshot, one is
built in the background (:mod:`rigd.backends.warm`).
"""

from __future__ import annotations

import functools
import json
import logging
import secrets
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import trio

from rigd.backends.base import ForkImage, Machine, MachineSpec
from rigd.backends.confine import Identity, UidPool, give, make_private_dir
from rigd.backends.gates import NetGate, open_gate
from rigd.backends.layout import Layout, remove_files, remove_tree
from rigd.backends.qemu import QemuConfig, QemuMachine, make_overlay, open_qemu_machine, run_quiet
from rigd.backends.recipe import BootRecipe, OpenPlan, RecipeSource, RigPaths, cold_plan, plan_open
from rigd.backends.snapshot import DISK_FILE, MEMORY_FILE, Snapshot, copy_disk
from rigd.backends.warm import SnapshotService
from rigd.errors import BackendError, Conflict, RigdError
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
        if spec.fork is not None:
            async with self._open_fork(spec, spec.fork, recipe, log, progress) as machine:
                yield machine
            return
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

    async def freeze(self, machine: Machine, *, standalone: bool = False) -> ForkImage:
        """Freeze a running machine of this backend for ``rig.fork`` or a named snapshot (see
        :class:`ForkImage`)."""
        if not isinstance(machine, QemuMachine):
            raise Conflict("this machine cannot be forked")
        into = self.layout.forks_dir / f"{machine.spec.rig_id}-{secrets.token_hex(4)}"
        await trio.to_thread.run_sync(functools.partial(into.mkdir, mode=0o700))
        base = None
        try:
            paused, sent = await machine.freeze(into)
            if standalone:
                base = await self._rebase_on_base(into / DISK_FILE)
        except BaseException:
            with trio.CancelScope(shield=True):
                await trio.to_thread.run_sync(remove_tree, into)
            raise
        machine.log.info("frozen", extra={"paused_s": round(paused, 3), "ram_bytes": sent})
        return ForkImage(dir=into, disk=into / DISK_FILE, memory=into / MEMORY_FILE, spec=machine.spec,
                         parent=machine.spec.rig_id, paused_s=paused, ram_bytes=sent, base=base)

    async def _rebase_on_base(self, disk: Path) -> Path:
        """Make ``disk`` depend only on the image at the bottom of its backing chain (a rig's
        overlay may be over a warm-start snapshot's disk, which a rebuilt pack prunes); return
        that image. ``qemu-img rebase`` in safe mode copies what the middle layers held."""
        try:
            result = await trio.run_process(
                [self.config.qemu_img, "info", "--backing-chain", "--output=json", "-U", str(disk)],
                capture_stdout=True, capture_stderr=True, check=False)
            chain = json.loads(result.stdout) if result.returncode == 0 else None
        except (OSError, ValueError) as exc:
            raise BackendError(f"reading the disk's backing chain: {exc}") from exc
        if not isinstance(chain, list) or not chain:
            raise BackendError("reading the disk's backing chain: "
                               + result.stderr.decode(errors="replace")[-300:])
        bottom = chain[-1]
        base = Path(str(bottom.get("filename")))
        if len(chain) > 2:
            await run_quiet([self.config.qemu_img, "rebase", "-q", "-f", "qcow2", "-b", str(base),
                             "-F", str(bottom.get("format") or "raw"), str(disk)],
                            what="making the snapshot's disk depend on its image alone")
        return base

    @asynccontextmanager
    async def _open_fork(
        self, spec: MachineSpec, image: ForkImage, recipe: BootRecipe, log: logging.Logger,
        progress: Callable[[str], None],
    ) -> AsyncIterator[QemuMachine]:
        """A copy of a frozen machine: the parent's disk copied (this copy's writes are its own),
        its RAM restored, then made unique (machine-id, RNG, MAC) as after a warm start. A
        copy that does not restore fails saying why: it never boots something else."""
        async with (
            open_gate(self.config.network, spec.rig_id, spec.network, progress) as gateway,
            self.layout.rig_files(spec.rig_id, self.uids) as (paths, identity),
        ):
            progress("copying the parent's disk")
            try:
                await trio.to_thread.run_sync(copy_disk, image.disk, paths.overlay)
            except OSError as exc:
                raise BackendError(f"copying the parent's disk: {exc}") from exc
            give(paths.overlay, identity, 0o600)
            async with open_qemu_machine(spec=spec, recipe=recipe, config=self.config, identity=identity,
                                         paths=paths, gateway=gateway, log=log) as machine:
                progress("restoring the parent's memory")
                log.info("fork", extra={"parent": image.parent})
                await machine.restore(progress, Snapshot(f"fork-of-{image.parent}", image.dir, {}))
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
