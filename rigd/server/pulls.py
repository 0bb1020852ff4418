"""Registry pulls as jobs the CLI and the page watch (``image.pull`` and friends).

How this works: a pull (:meth:`rigd.images.registry.RegistryClient.pull`) is
Trio-native, so each job is a task in :meth:`PullJobs.run`'s nursery inside its
own cancel scope; the client's progress callback writes bytes, total and phase
into the job, and ``image.pullStatus`` reads them with a rate over the last
seconds and an ETA (:func:`rigd.server.imports.rate_and_eta`, as imports do).
Cancelling (``image.pullCancel``, or the server stopping) leaves the blobs
fetched so far, verified, and the partial one on disk: the next pull of the
image resumes it. The pull runs on the host, never through a rig's gate. Jobs
live in memory only: the last :data:`KEEP_JOBS`, at most :data:`MAX_RUNNING`
at once; what was pulled is the store's (``<dataDir>/rigs/oci``).
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import trio

from rigd.errors import Conflict, RigdError
from rigd.images.blobs import BlobStore
from rigd.images.registry import Progress, Pulled, Reference, RegistryClient
from rigd.rigs.events import IMAGE_PULL_ENDED, IMAGE_PULL_PROGRESS, EventBus
from rigd.server.imports import RATE_WINDOW_S, JobState, JobTable, rate_and_eta
from rigd.store.util import iso, new_id

log = logging.getLogger("rigd.images")

#: Pulls that may run at once (each holds up to three blob fetches).
MAX_RUNNING = 2
#: The least time between two progress events of one pull.
EVENT_INTERVAL_S = 1.0


def store_dir(data_dir: Path) -> Path:
    """Where pulled images live: one OCI image layout, blobs shared by every image."""
    return data_dir / "rigs" / "oci"


@dataclass(eq=False)
class PullJob:
    id: str
    reference: Reference
    started_at: str
    scope: trio.CancelScope = field(default_factory=trio.CancelScope)
    ended: trio.Event = field(default_factory=trio.Event)
    state: JobState = JobState.RUNNING
    phase: str = "starting"
    done: int = 0
    total: int | None = None
    reused: int = 0
    error: RigdError | None = None
    pulled: Pulled | None = None
    cancel_requested: bool = False
    finished_at: str | None = None
    #: Told every progress report (a rig waiting for its image says how far the pull is).
    watchers: list[Callable[[Progress], None]] = field(default_factory=list)
    #: The workspaces told of this pull by events (``image.pull {workspace}``).
    announce: set[str] = field(default_factory=set)
    changed: trio.Event = field(default_factory=trio.Event)
    _t0: float = field(default_factory=time.monotonic)
    _samples: deque[tuple[float, int]] = field(default_factory=deque)

    def progress(self, p: Progress) -> None:
        for watch in list(self.watchers):
            watch(p)
        self.changed.set()
        now = time.monotonic()
        self.phase, self.done, self.reused = p.phase, p.done_bytes, p.reused_bytes
        self.total = p.total_bytes or None
        # The rate counts fetched bytes only (what was on disk already moved nothing).
        self._samples.append((now, p.fetched_bytes))
        while len(self._samples) > 1 and now - self._samples[0][0] > RATE_WINDOW_S:
            self._samples.popleft()

    def end(self, state: JobState, *, error: RigdError | None = None) -> None:
        if self.state is not JobState.RUNNING:
            raise Conflict(f"pull {self.id} is {self.state.value} already")
        self.state, self.error = state, error
        self.finished_at = iso(datetime.now(UTC))
        self.phase = state.value

    def to_json(self) -> dict[str, Any]:
        rate: int | None = None
        eta: int | None = None
        if self.state is JobState.RUNNING:
            # The samples count fetched bytes: the target is what is fetched plus what is left.
            fetched = self._samples[-1][1] if self._samples else 0
            target = None if self.total is None else fetched + max(0, self.total - self.done)
            rate, eta = rate_and_eta(list(self._samples), time.monotonic(), target)
        return {
            "pullId": self.id,
            "reference": str(self.reference),
            "state": self.state.value,
            "phase": self.phase,
            "bytes": self.done,
            "totalBytes": self.total,
            "reusedBytes": self.reused,
            "rateBps": rate,
            "etaS": eta,
            "error": None if self.error is None else {"message": self.error.message, "data": self.error.data},
            "image": None if self.pulled is None else self.pulled.to_json(),
            "cancelRequested": self.cancel_requested,
            "startedAt": self.started_at,
            "finishedAt": self.finished_at,
        }


class PullJobs(JobTable[PullJob]):
    """The server's pulls (:class:`rigd.server.imports.JobTable`)."""

    what = "pull"
    id_field = "pullId"

    def __init__(self, data_dir: Path, client: RegistryClient, events: EventBus | None = None) -> None:
        super().__init__()
        self.client = client
        self.store = BlobStore(store_dir(data_dir))
        self.events = events

    def start(self, ref: Reference, *, announce: str | None = None) -> PullJob:
        """Start a pull; ``announce`` names a workspace told its progress by events (a pull
        of the same reference already running is refused, naming it: watch that one)."""
        job = self._start(ref)
        if announce is not None:
            job.announce.add(announce)
            assert self._nursery is not None
            self._nursery.start_soon(self._announce, job)
        return job

    async def _announce(self, job: PullJob) -> None:
        """``ImagePullProgress`` at most every :data:`EVENT_INTERVAL_S` while the job runs,
        then ``ImagePullEnded``; an event that cannot be written is logged, never the pull's end."""
        assert self.events is not None
        try:
            while job.state is JobState.RUNNING:
                with trio.move_on_after(EVENT_INTERVAL_S * 4):  # quiet pulls still say they run
                    await job.changed.wait()
                job.changed = trio.Event()
                if job.state is not JobState.RUNNING:
                    break
                shown = job.to_json()
                for ws in sorted(job.announce):
                    await self.events.publish(ws, "", IMAGE_PULL_PROGRESS, **{
                        k: shown[k] for k in ("pullId", "reference", "phase", "bytes", "totalBytes",
                                              "reusedBytes", "rateBps", "etaS")})
                with trio.move_on_after(EVENT_INTERVAL_S):
                    await job.ended.wait()
            await job.ended.wait()
            shown = job.to_json()
            for ws in sorted(job.announce):
                await self.events.publish(ws, "", IMAGE_PULL_ENDED, **{
                    k: shown[k] for k in ("pullId", "reference", "state", "bytes", "error")},
                    digest=job.pulled.digest if job.pulled is not None else None)
        except Exception:
            log.exception("could not write a pull's events", extra={"pull": job.id})

    def _start(self, ref: Reference) -> PullJob:
        if self._nursery is None:
            raise Conflict("image pulls are not running (the server is starting or stopping)")
        running = self.running()
        for job in running:
            if str(job.reference) == str(ref):
                raise Conflict(f"{ref} is being pulled already (pull {job.id})", field="ref", pullId=job.id)
        if len(running) >= MAX_RUNNING:
            raise Conflict(f"at most {MAX_RUNNING} pulls run at once and "
                           f"{', '.join(j.id for j in running)} are running; wait for one or cancel it",
                           limit=MAX_RUNNING, running=[j.id for j in running])
        return self._launch(PullJob(new_id("pul"), ref, iso(datetime.now(UTC))), self._run)

    async def ensure(self, ref: Reference, progress: Callable[[str], None]) -> str:
        """The digest of ``ref`` in the store, pulling it first if it is not there (joining a
        pull of it already running). A tag found in the store keeps the digest it was pinned
        to when it was pulled: it is not resolved again."""
        image = await trio.to_thread.run_sync(self.store.find, str(ref))
        if image is not None and isinstance(image.get("digest"), str):
            return str(image["digest"])
        job = next((j for j in self.running() if str(j.reference) == str(ref)), None) or self._start(ref)

        def watch(p: Progress) -> None:
            total = f" of {p.total_bytes / 1e6:.1f} MB" if p.total_bytes else ""
            progress(f"pulling image {ref}: {p.done_bytes / 1e6:.1f} MB{total}")

        progress(f"pulling image {ref}")
        job.watchers.append(watch)
        try:
            await job.ended.wait()
        finally:
            job.watchers.remove(watch)
        if job.state is JobState.DONE and job.pulled is not None:
            return job.pulled.digest
        if job.error is not None:
            raise RigdError(f"pulling {ref} failed: {job.error.message}", pullId=job.id)
        raise RigdError(f"the pull of {ref} was {job.state.value} ({job.id})", pullId=job.id)

    async def _run(self, job: PullJob) -> None:
        try:
            with job.scope:
                job.pulled = await self.client.pull(job.reference, self.store, job.progress)
                log.info("pulled %s: %d bytes fetched, %d already here", job.pulled.reference,
                         job.pulled.fetched_bytes, job.pulled.reused_bytes)
                job.end(JobState.DONE)
        except RigdError as exc:
            log.warning("pull %s of %s failed: %s", job.id, job.reference, exc.message)
            job.end(JobState.FAILED, error=exc)
        except Exception as exc:  # a pull is its own failure boundary: the server keeps serving
            log.exception("pull %s of %s failed", job.id, job.reference)
            job.end(JobState.FAILED, error=RigdError(f"the pull failed: {type(exc).__name__}: {exc}",
                                                     reason=type(exc).__name__))
        finally:
            if job.state is JobState.RUNNING:
                job.end(JobState.CANCELLED)
            job.ended.set()


__all__ = ["MAX_RUNNING", "PullJob", "PullJobs", "store_dir"]
