"""Desktop image imports as jobs the settings page can watch (``image.import`` and friends).

How this works: :func:`rigd.images.importer.import_image` is synchronous and
copies gigabytes, so each job runs it on a worker thread
(``trio.to_thread.run_sync``, not abandoned on cancel) inside its own cancel
scope. The importer calls back on that thread: structured progress (bytes so
far, the total when known, the phase in words) is written into the job under
a lock; its ``check`` is ``trio.from_thread.check_cancelled``, so cancelling
the job's scope — ``image.importCancel``, or the server shutting down — makes
the copy loop raise at its next chunk, and the importer removes its staging
directory before the thread ends. Jobs live in memory only: the last
:data:`KEEP_JOBS`, at most :data:`MAX_RUNNING` running at once.
"""

from __future__ import annotations

import enum
import functools
import logging
import math
import threading
import time
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Generic, Protocol, TypeVar

import trio

from rigd.errors import Conflict, NotFound, RigdError
from rigd.images.importer import BootChoice, ImportedImage, ImportProgress, import_image
from rigd.images.manifest import ImageManifest, parse_manifest
from rigd.store.util import iso, new_id

log = logging.getLogger("rigd.images")

#: Imports that may run at once (each holds a worker thread and a disk's worth of I/O).
MAX_RUNNING = 2
#: Jobs kept in memory, finished or not; the oldest finished ones are forgotten first.
KEEP_JOBS = 20
#: The rate is measured over this much recent time.
RATE_WINDOW_S = 5.0
#: ``image.importCancel`` waits this long for the worker to notice before answering.
CANCEL_WAIT_S = 5.0

Importer = Callable[..., ImportedImage]


class JobState(enum.Enum):
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"
    CANCELLED = "cancelled"


#: The one allowed move: a running job ends once, in one of the other states.
_ENDS = frozenset({JobState.DONE, JobState.FAILED, JobState.CANCELLED})


def rate_and_eta(samples: Sequence[tuple[float, int]], now: float,
                 total: int | None) -> tuple[int | None, int | None]:
    """Bytes per second over the samples' span up to ``now``, and seconds left (pure).

    ``samples`` are ``(monotonic time, bytes so far)``, oldest first. The rate
    is unknown over less than half a second; the ETA is unknown without a
    total or while nothing moves.
    """
    if not samples:
        return None, None
    t0, b0 = samples[0]
    _t1, b1 = samples[-1]
    span = now - t0
    if span < 0.5:
        return None, None
    rate = max(0, int((b1 - b0) / span))
    if total is None or rate == 0:
        return rate, None
    return rate, max(0, math.ceil((total - b1) / rate))


def image_entry(img: ImportedImage, boots: bool) -> dict[str, Any]:
    """One row of ``image.list`` (also the ``image`` of a finished job)."""
    try:
        imported_at: str | None = iso(datetime.fromtimestamp(img.dir.stat().st_mtime, UTC))
    except OSError:
        imported_at = None
    return {"sha256": img.sha256, "dir": str(img.dir), **_described(img.manifest),
            "importedAt": imported_at, "boots": boots, "state": "imported"}


def _described(m: ImageManifest) -> dict[str, Any]:
    """What a row of ``image.list`` says of an image's manifest."""
    return {"surface": m.surface, "guestProtocol": m.guest_protocol,
            "display": {"width": m.width, "height": m.height}, "kernelRelease": m.kernel_release,
            "bytes": m.disk.size}


#: What ``image.list`` says of a desktop build that is not imported yet.
BUILT_NOTE = "built (make images-desktop); imported when the first desktop opens"


def listing(choice: BootChoice) -> list[dict[str, Any]]:
    """``image.list``: every import, the one that boots marked; and a desktop build in the cache
    that is not imported yet (``state: "built"``): it is what the next rig boots, imported first."""
    rows = [image_entry(i, choice.boots is not None and i.dir == choice.boots.dir) for i in choice.imported]
    if choice.pending is not None:
        path, digest = choice.pending
        try:
            m = parse_manifest(path.read_bytes(), str(path))
        except (OSError, RigdError) as exc:
            log.warning("the built desktop image's manifest is unreadable", extra={"reason": str(exc)[:200]})
            return rows
        rows.append({"sha256": digest, "dir": str(path.parent), **_described(m), "importedAt": None,
                     "boots": True, "state": "built", "note": BUILT_NOTE})
    return rows


@dataclass(eq=False)
class ImportJob:
    id: str
    source: str
    sha256: str
    started_at: str
    scope: trio.CancelScope = field(default_factory=trio.CancelScope)
    ended: trio.Event = field(default_factory=trio.Event)
    state: JobState = JobState.RUNNING
    phase: str = "starting"
    bytes: int = 0
    total: int | None = None
    error: RigdError | None = None
    image: dict[str, Any] | None = None
    already_present: bool | None = None
    cancel_requested: bool = False
    finished_at: str | None = None
    _t0: float = field(default_factory=time.monotonic)
    _t_end: float | None = None
    _samples: deque[tuple[float, int]] = field(default_factory=deque)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def progress(self, p: ImportProgress) -> None:
        """The importer's callback (on the worker thread)."""
        now = time.monotonic()
        with self._lock:
            self.phase, self.bytes, self.total = p.phase, p.bytes, p.total_bytes
            self._samples.append((now, p.bytes))
            while len(self._samples) > 1 and now - self._samples[0][0] > RATE_WINDOW_S:
                self._samples.popleft()

    def end(self, state: JobState, *, error: RigdError | None = None) -> None:
        if self.state is not JobState.RUNNING or state not in _ENDS:
            raise Conflict(f"import {self.id} is {self.state.value}; only a running import can become "
                           f"{state.value}")
        with self._lock:
            self.state, self.error = state, error
            self._t_end = time.monotonic()
            self.finished_at = iso(datetime.now(UTC))
            self.phase = {JobState.DONE: "done", JobState.FAILED: "failed",
                          JobState.CANCELLED: "cancelled"}[state]

    def to_json(self) -> dict[str, Any]:
        with self._lock:
            now = time.monotonic()
            if self.state is JobState.RUNNING:
                rate, eta = rate_and_eta(list(self._samples), now, self.total)
            elif self.state is JobState.DONE:
                span = (self._t_end or now) - self._t0
                rate, eta = (int(self.bytes / span) if span > 0 else None), 0
            else:
                rate, eta = None, None
            return {
                "importId": self.id,
                "source": self.source,
                "sha256": self.sha256,
                "state": self.state.value,
                "phase": self.phase,
                "bytes": self.bytes,
                "totalBytes": self.total,
                "rateBps": rate,
                "etaS": eta,
                "error": None if self.error is None else {"message": self.error.message,
                                                          "data": self.error.data},
                "image": self.image,
                "alreadyPresent": self.already_present,
                "cancelRequested": self.cancel_requested,
                "startedAt": self.started_at,
                "finishedAt": self.finished_at,
            }


class _Job(Protocol):
    id: str
    state: JobState
    scope: trio.CancelScope
    ended: trio.Event
    cancel_requested: bool


J = TypeVar("J", bound=_Job)


class JobTable(Generic[J]):
    """Background jobs of one kind, in memory: ``run`` (started with ``nursery.start``) owns
    their tasks; the last :data:`KEEP_JOBS` are kept, the oldest finished ones forgotten first."""

    #: The kind in words ("import") and the field its id is asked by ("importId").
    what = "job"
    id_field = "jobId"

    def __init__(self) -> None:
        self._jobs: dict[str, J] = {}
        self._nursery: trio.Nursery | None = None

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                task_status.started()
                await trio.sleep_forever()
        finally:
            self._nursery = None

    def running(self) -> list[J]:
        return [j for j in self._jobs.values() if j.state is JobState.RUNNING]

    def get(self, job_id: str) -> J:
        job = self._jobs.get(job_id)
        if job is None:
            raise NotFound(f"no {self.what} {job_id!r} (the last {KEEP_JOBS} are kept, in memory)",
                           field=self.id_field)
        return job

    def _launch(self, job: J, task: Callable[[J], Awaitable[None]]) -> J:
        assert self._nursery is not None
        self._jobs[job.id] = job
        finished = [j for j in self._jobs.values() if j.state is not JobState.RUNNING]
        for old in finished[: max(0, len(self._jobs) - KEEP_JOBS)]:
            del self._jobs[old.id]
        self._nursery.start_soon(task, job)
        return job

    async def cancel(self, job_id: str) -> J:
        """Cancel a running job and wait (a few seconds at most) for it to stop; a finished
        job is returned as it is."""
        job = self.get(job_id)
        if job.state is JobState.RUNNING:
            job.cancel_requested = True
            job.scope.cancel()
            with trio.move_on_after(CANCEL_WAIT_S):
                await job.ended.wait()
        return job


class ImportJobs(JobTable[ImportJob]):
    """The server's import jobs.

    ``listing`` says what is imported and which image boots (the server
    passes :func:`rigd.server.main.which_boots`); ``importer`` is the seam
    unit tests replace (the real one is :func:`import_image`).
    """

    what = "import"
    id_field = "importId"

    def __init__(self, data_dir: Path, listing: Callable[[], BootChoice], *,
                 importer: Importer = import_image) -> None:
        super().__init__()
        self.data_dir = data_dir
        self.listing = listing
        self._importer = importer

    def start(self, source: str, sha256: str) -> ImportJob:
        """Start importing; ``source`` and ``sha256`` are checked already. Raises
        :class:`Conflict` when :data:`MAX_RUNNING` run, or the same digest is being imported."""
        if self._nursery is None:
            raise Conflict("image imports are not running (the server is starting or stopping)")
        running = self.running()
        for job in running:
            if job.sha256 == sha256:
                raise Conflict(f"sha256:{sha256} is being imported already (import {job.id})",
                               field="sha256", importId=job.id)
        if len(running) >= MAX_RUNNING:
            ids = ", ".join(j.id for j in running)
            raise Conflict(f"at most {MAX_RUNNING} imports run at once and {ids} are running; "
                           "wait for one to finish or cancel it", limit=MAX_RUNNING,
                           running=[j.id for j in running])
        return self._launch(ImportJob(new_id("imp"), source, sha256, iso(datetime.now(UTC))), self._run)

    async def _run(self, job: ImportJob) -> None:
        work = functools.partial(self._importer, job.source, job.sha256, self.data_dir,
                                 progress=lambda msg: log.info("import %s: %s", job.id, msg),
                                 on_progress=job.progress, check=trio.from_thread.check_cancelled)
        image: ImportedImage | None = None
        try:
            with job.scope:
                image = await trio.to_thread.run_sync(work, abandon_on_cancel=False)
            if image is not None:
                # Done, even if a cancel came after the last check: the image is in place.
                boots = False
                with trio.CancelScope(shield=True):  # a few small reads; the job ends as done
                    try:
                        choice = await trio.to_thread.run_sync(self.listing)
                    except (RigdError, OSError):
                        log.exception("import %s: cannot tell which image boots", job.id)
                    else:
                        boots = choice.boots is not None and choice.boots.dir == image.dir
                job.already_present = image.already_present
                job.image = image_entry(image, boots)
                job.end(JobState.DONE)
        except RigdError as exc:
            log.warning("import %s failed: %s", job.id, exc.message)
            job.end(JobState.FAILED, error=exc)
        except Exception as exc:
            log.exception("import %s failed", job.id)
            job.end(JobState.FAILED, error=RigdError(f"the import failed: {type(exc).__name__}: {exc}",
                                                     reason=type(exc).__name__))
        finally:
            if job.state is JobState.RUNNING:
                job.end(JobState.CANCELLED)
            job.ended.set()


__all__ = ["KEEP_JOBS", "MAX_RUNNING", "ImportJob", "ImportJobs", "JobState", "JobTable", "image_entry",
           "listing", "rate_and_eta"]
