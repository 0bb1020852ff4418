"""Pull jobs (rigd.server.pulls) over a scripted client: states, progress, limits, cancel."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio

from rigd.errors import Conflict, NotFound
from rigd.images.blobs import BlobStore
from rigd.images.registry import Progress, Pulled, Reference, RegistryError, parse_reference
from rigd.rigs.events import EventBus
from rigd.server.pulls import MAX_RUNNING, PullJobs
from rigd.store.aio import Stores

pytestmark = pytest.mark.timeout(30)

DIGEST = "sha256:" + "cd" * 32


class ScriptedClient:
    """Pulls that report progress, then finish, fail or wait until told."""

    def __init__(self) -> None:
        self.release = trio.Event()
        self.fail: RegistryError | None = None
        self.hold = False

    async def pull(self, ref: Reference, store: BlobStore, on_progress: Any) -> Pulled:
        p = Progress(str(ref), total_bytes=1000)
        p.phase = "fetching"
        p.done_bytes = p.fetched_bytes = 400
        p.reused_bytes = 100
        on_progress(p)
        if self.hold:
            await self.release.wait()
        if self.fail is not None:
            raise self.fail
        return Pulled(ref.pinned(DIGEST), DIGEST, None, (DIGEST,), 1000, 900, 100)


async def settled(jobs: PullJobs, pull_id: str) -> dict[str, Any]:
    with trio.fail_after(5):
        while (out := jobs.get(pull_id).to_json())["state"] == "running":
            await trio.sleep(0.01)
    return out


async def test_a_pull_runs_to_done_with_its_image(tmp_path: Path) -> None:
    jobs = PullJobs(tmp_path, ScriptedClient())  # type: ignore[arg-type]
    async with trio.open_nursery() as nursery:
        await nursery.start(jobs.run)
        job = jobs.start(parse_reference("127.0.0.1:5000/t/img:v1"))
        out = await settled(jobs, job.id)
        nursery.cancel_scope.cancel()
    assert out["state"] == "done" and out["phase"] == "done" and out["etaS"] is None
    assert out["image"]["reference"] == f"127.0.0.1:5000/t/img:v1@{DIGEST}"
    assert (out["bytes"], out["totalBytes"], out["reusedBytes"]) == (400, 1000, 100)
    assert (tmp_path / "rigs" / "oci" / "oci-layout").is_file()


async def test_running_pulls_are_bounded_and_one_reference_runs_once(tmp_path: Path) -> None:
    client = ScriptedClient()
    client.hold = True
    jobs = PullJobs(tmp_path, client)  # type: ignore[arg-type]
    async with trio.open_nursery() as nursery:
        await nursery.start(jobs.run)
        first = jobs.start(parse_reference("a.test/x:1"))
        with pytest.raises(Conflict) as err:
            jobs.start(parse_reference("a.test/x:1"))
        assert err.value.data["pullId"] == first.id
        for i in range(2, MAX_RUNNING + 1):
            jobs.start(parse_reference(f"a.test/x:{i}"))
        with pytest.raises(Conflict, match="at most"):
            jobs.start(parse_reference("a.test/x:99"))
        await trio.sleep(0.05)
        status = first.to_json()
        assert status["state"] == "running" and status["phase"] == "fetching"
        cancelled = await jobs.cancel(first.id)
        assert cancelled.to_json()["state"] == "cancelled" and cancelled.cancel_requested
        client.release.set()
        nursery.cancel_scope.cancel()
    with pytest.raises(NotFound):
        jobs.get("pul_nope")


async def test_a_failed_pull_says_why_and_the_server_keeps_going(tmp_path: Path) -> None:
    client = ScriptedClient()
    client.fail = RegistryError("a.test/x: blob sha256:… does not match its descriptor; refused and deleted")
    jobs = PullJobs(tmp_path, client)  # type: ignore[arg-type]
    async with trio.open_nursery() as nursery:
        await nursery.start(jobs.run)
        out = await settled(jobs, jobs.start(parse_reference("a.test/x:1")).id)
        client.fail = None
        again = await settled(jobs, jobs.start(parse_reference("a.test/x:1")).id)
        nursery.cancel_scope.cancel()
    assert out["state"] == "failed" and "does not match" in out["error"]["message"]
    assert again["state"] == "done"


def test_pulls_are_refused_before_the_jobs_run(tmp_path: Path) -> None:
    jobs = PullJobs(tmp_path, ScriptedClient())  # type: ignore[arg-type]
    with pytest.raises(Conflict, match="not running"):
        jobs.start(parse_reference("a.test/x:1"))


async def test_a_pull_tells_its_workspace_by_events(tmp_path: Path) -> None:
    stores = Stores(tmp_path)
    try:
        _admin, ws, _token = stores.server.bootstrap()
        events = EventBus(stores)
        client = ScriptedClient()
        client.hold = True
        jobs = PullJobs(tmp_path, client, events)  # type: ignore[arg-type]
        seen = events.subscribe(ws.id)
        async with trio.open_nursery() as nursery:
            await nursery.start(jobs.run)
            job = jobs.start(parse_reference("127.0.0.1:5000/t/img:v1"), announce=ws.id)
            with trio.fail_after(10):
                progress = await seen.receive()
                client.release.set()
                ended = await seen.receive()
            nursery.cancel_scope.cancel()
        assert progress["type"] == "ImagePullProgress" and progress["pullId"] == job.id
        assert (progress["bytes"], progress["totalBytes"], progress["reference"]) == (
            400, 1000, "127.0.0.1:5000/t/img:v1")
        assert ended["type"] == "ImagePullEnded" and ended["state"] == "done" and ended["digest"] == DIGEST
        # Kept with the workspace's events, as every event is.
        db = await stores.workspace(ws.id)
        kept = [e["type"] for e in db.events(limit=10)]
        assert kept == ["ImagePullProgress", "ImagePullEnded"]
    finally:
        stores.close()
