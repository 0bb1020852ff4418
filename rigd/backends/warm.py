"""Warm starts as a service of their own: which snapshot a shape has, and
building the ones that are missing.

A shape's key (:func:`rigd.backends.snapshot.snapshot_key`) covers the
recipe's argv at placeholder paths, the backing image's identity, the QEMU
binary and the assets; :meth:`SnapshotService.plan` finds the snapshot of a
key in a worker thread. After the first cold boot of a shape with no snapshot,
:meth:`SnapshotService.schedule` builds one in the background: an idle
machine of that shape boots, syncs, stops and is saved (QMP ``migrate`` to
zstd), and the snapshot is committed next to the image. Builds run in the
service's own nursery (:meth:`SnapshotService.run`); a build that fails is
logged and its shape boots cold for a while (:func:`should_build`), never
failing a rig or the server.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import logging
import os
import shutil
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import trio

from rigd.backends.base import MachineSpec
from rigd.backends.confine import UidPool, make_private_dir
from rigd.backends.gates import open_gate
from rigd.backends.layout import Layout, remove_tree, unlink
from rigd.backends.qemu import QemuConfig, make_overlay, open_qemu_machine
from rigd.backends.recipe import BootRecipe, RigPaths, WarmPlan
from rigd.backends.snapshot import (
    SnapshotStore,
    file_identity,
    should_build,
    snapshot_key,
    snapshot_material,
)
from rigd.errors import BackendError, RigdError


class SnapshotService:
    def __init__(self, config: QemuConfig, layout: Layout, uids: UidPool) -> None:
        self.config = config
        self.layout = layout
        self.uids = uids
        self.log = logging.getLogger("rigd.snapshots")
        self._qemu_id: tuple[str, dict[str, int]] | None = None
        self._background: trio.Nursery | None = None
        self._building: set[str] = set()
        self._build_failed: dict[str, float] = {}
        #: Restore failures per key (monotonic times), for :func:`should_build`.
        self._restore_failed: dict[str, list[float]] = {}

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Own the background builds until cancelled (``nursery.start(service.run)``).

        Without it, builds run as Trio system tasks (cancelled when the run ends).
        """
        async with trio.open_nursery() as nursery:
            self._background = nursery
            task_status.started()
            try:
                await trio.sleep_forever()
            finally:
                self._background = None

    # -- which snapshot a shape has --------------------------------------------------

    async def _qemu_identity(self) -> tuple[str, dict[str, int]]:
        if self._qemu_id is None:
            try:
                result = await trio.run_process(
                    [self.config.qemu, "--version"], capture_stdout=True, capture_stderr=True, check=False
                )
                version = result.stdout.decode("utf-8", "replace").splitlines()[0].strip()
            except (OSError, IndexError) as exc:
                raise BackendError(f"cannot ask {self.config.qemu} for its version: {exc}") from exc
            path = shutil.which(self.config.qemu) or self.config.qemu
            st = await trio.Path(path).stat()
            self._qemu_id = (version, file_identity(st))
        return self._qemu_id

    async def plan(self, recipe: BootRecipe, spec: MachineSpec) -> WarmPlan:
        """The snapshot key of this machine shape and the snapshot, if one is ready."""
        version, binary = await self._qemu_identity()
        return await trio.to_thread.run_sync(plan_sync, recipe, spec, version, binary, self.log)

    def restored(self, plan: WarmPlan) -> None:
        assert plan.snapshot is not None
        self._restore_failed.pop(plan.key, None)
        plan.store.touch(plan.key)

    def restore_failed(self, plan: WarmPlan, reason: str) -> None:
        self._restore_failed.setdefault(plan.key, []).append(time.monotonic())
        plan.store.discard(plan.key, f"restore failed: {reason}")

    # -- builds ------------------------------------------------------------------------

    def _spawn(self, fn: Callable[[], Awaitable[None]], name: str) -> None:
        async def guarded() -> None:
            try:
                await fn()
            except trio.Cancelled:
                raise
            except Exception:  # a background failure must never take the server down
                self.log.exception("background task failed", extra={"task": name})

        if self._background is not None:
            self._background.start_soon(guarded, name=name)
        else:
            # (a system task would otherwise start in an empty context)
            trio.lowlevel.spawn_system_task(guarded, name=name, context=contextvars.copy_context())

    def schedule(self, recipe: BootRecipe, spec: MachineSpec, plan: WarmPlan) -> None:
        """Build this shape's snapshot in the background, unless that is pointless now."""
        key = plan.key
        if not should_build(time.monotonic(), building=key in self._building,
                            build_failed_at=self._build_failed.get(key),
                            restore_failures=self._restore_failed.get(key, ())):
            return
        self._building.add(key)

        async def build() -> None:
            try:
                await self._build(recipe, spec, plan)
            except (RigdError, OSError) as exc:
                self._build_failed[key] = time.monotonic()
                reason = exc.message if isinstance(exc, RigdError) else str(exc)
                self.log.warning("snapshot build failed; rigs of this shape boot cold",
                                 extra={"snapshot": key, "reason": reason[:300]})
            except BaseException:
                self._build_failed[key] = time.monotonic()
                raise
            finally:
                self._building.discard(key)

        self._spawn(build, f"snapshot-{key}")

    async def ensure(self, recipe: BootRecipe, spec: MachineSpec) -> None:
        """Make sure a snapshot of this shape exists or is being built (server start)."""
        if not (self.config.warm_starts and recipe.warm_eligible(spec)):
            return
        plan = await self.plan(recipe, spec)
        if plan.snapshot is None:
            self.schedule(recipe, spec, plan)

    async def _build(self, recipe: BootRecipe, spec: MachineSpec, plan: WarmPlan) -> None:
        """Boot an idle machine of this shape, save it, and commit the snapshot."""
        key, store = plan.key, plan.store
        log = logging.getLogger(f"rigd.snapshot.{key}")
        t0 = time.monotonic()
        build_spec = MachineSpec(rig_id=f"snapshot-{key}", surface=spec.surface,
                                 memory_mb=spec.memory_mb, vcpus=spec.vcpus)
        with contextlib.ExitStack() as stack:
            tmp = await trio.to_thread.run_sync(stack.enter_context, store.building(key))
            if tmp is None:
                return  # built, or being built by another process
            identity = self.uids.acquire()
            rig_dir, pidfile = self.layout.build_dir(key)
            paths = RigPaths(rig_dir, tmp / "disk.qcow2")
            try:
                await trio.to_thread.run_sync(remove_tree, paths.rig_dir)
                make_private_dir(paths.rig_dir, identity)
                await make_overlay(self.config.qemu_img, paths.overlay, recipe.backing,
                                   recipe.backing_format, identity, what="creating the snapshot disk")
                log.info("building a snapshot", extra={"memory_mb": spec.memory_mb, "vcpus": spec.vcpus})
                async with (
                    open_gate(self.config.network, build_spec.rig_id, None, _no_progress) as gateway,
                    open_qemu_machine(
                        spec=build_spec, recipe=recipe, config=self.config, identity=identity,
                        paths=paths, gateway=gateway, log=log,
                        on_started=functools.partial(_write_pidfile, pidfile),
                    ) as machine,
                ):
                    await machine.boot(_no_progress, personalize=False, surface=not recipe.snapshot_at_hello)
                    boot_s = time.monotonic() - t0
                    sent = await machine.save(tmp / "memory.zst")
                snap = await trio.to_thread.run_sync(
                    lambda: store.commit(tmp, key, plan.material, bootS=round(boot_s, 2),
                                         buildS=round(time.monotonic() - t0, 2), ramBytesSent=sent)
                )
            finally:
                with trio.CancelScope(shield=True):
                    await trio.to_thread.run_sync(remove_tree, paths.rig_dir)
                    await trio.to_thread.run_sync(unlink, pidfile)
                    self.uids.release(identity)
        removed = await trio.to_thread.run_sync(store.prune, plan.material)
        log.info("snapshot built", extra={
            "seconds": round(time.monotonic() - t0, 2), "memory_bytes": snap.meta["sizes"]["memory.zst"],
            "pruned": ",".join(removed) or "-",
        })


def plan_sync(recipe: BootRecipe, spec: MachineSpec, version: str, binary: dict[str, int],
              log: logging.Logger | None = None) -> WarmPlan:
    """:meth:`SnapshotService.plan` without the QEMU probe (a worker thread; unit tests)."""
    backing = recipe.backing
    shape, assets = recipe.warm_shape(spec)
    material = snapshot_material(
        pack=backing.parent.name,
        rootfs=file_identity(backing.stat()),
        qemu_version=version,
        qemu_binary=binary,
        argv_shape=shape[1:],
        assets=assets,
    )
    key = snapshot_key(material)
    store = SnapshotStore(backing.parent / "snapshots", log=log)
    return WarmPlan(store, key, material, store.find(key))


def _no_progress(_step: str) -> None:
    pass


def _write_pidfile(path: Path, pid: int, ticks: int | None) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(f"{pid} {ticks or 0}\n")
    os.replace(tmp, path)
