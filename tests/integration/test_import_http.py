"""Importing a computer image over HTTP, from a server on loopback.

The only socket is the test's own HTTP server on 127.0.0.1 (in-process, a
thread); the bind step is overridden so that no reverse DNS lookup can hang
it (HOST-NOTES, Networks). The import-job tests (``image.import``) serve the
files in small pieces with pauses, so progress, rate and cancellation can be
seen mid-download.
"""

from __future__ import annotations

import hashlib
import http.server
import os
import shutil
import threading
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import trio

from rigd.errors import RigdError
from rigd.images.importer import ImportProgress, images_dir, import_image
from rigd.server.imports import ImportJob, ImportJobs
from rigd.server.main import which_boots
from tests.unit.test_images_vmlinux import fake_elf
from tests.unit.test_import import make_qcow2, write_manifest

pytestmark = [
    pytest.mark.timeout(60),
    pytest.mark.skipif(shutil.which("qemu-img") is None, reason="needs qemu-img"),
]


class _Server(http.server.ThreadingHTTPServer):
    def server_bind(self) -> None:  # no getfqdn(): it can hang without DNS
        self.socket.bind(self.server_address)
        self.server_address = self.socket.getsockname()
        self.server_name, self.server_port = "127.0.0.1", self.server_address[1]


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    pub = tmp_path / "pub"
    pub.mkdir()
    make_qcow2(pub / "desktop.qcow2")
    (pub / "vmlinux").write_bytes(fake_elf())
    (pub / "initrd.img").write_bytes(b"070701" + b"0" * 100)
    write_manifest(pub, disk=pub / "desktop.qcow2", kernel=pub / "vmlinux", initrd=pub / "initrd.img")
    srv = _Server(("127.0.0.1", 0), partial(_Quiet, directory=str(pub)))
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    try:
        yield f"http://127.0.0.1:{srv.server_port}", pub
    finally:
        srv.shutdown()
        srv.server_close()
        t.join(5)


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_import_a_manifest_and_its_files_over_http(served: tuple[str, Path], tmp_path: Path) -> None:
    url, pub = served
    data = tmp_path / "data"
    img = import_image(f"{url}/desktop.rigd-image.json", sha(pub / "desktop.rigd-image.json"), data)
    assert img.guest_protocol == 2
    assert img.disk.read_bytes() == (pub / "desktop.qcow2").read_bytes()
    assert img.kernel.read_bytes() == (pub / "vmlinux").read_bytes()


def test_import_a_bare_qcow2_url_with_a_wrong_digest_leaves_nothing(
    served: tuple[str, Path], tmp_path: Path
) -> None:
    url, pub = served
    data = tmp_path / "data"
    wrong = "f" * 64
    with pytest.raises(RigdError) as exc:
        import_image(f"{url}/desktop.qcow2", f"sha256:{wrong}", data)
    assert exc.value.data == {
        "source": f"{url}/desktop.qcow2",
        "expected": wrong,
        "actual": sha(pub / "desktop.qcow2"),
    }
    assert [p.name for p in images_dir(data).iterdir() if p.name != ".lock"] == []


def test_http_errors_are_reported_and_leave_nothing(served: tuple[str, Path], tmp_path: Path) -> None:
    url, pub = served
    data = tmp_path / "data"
    with pytest.raises(RigdError, match="HTTP 404"):
        import_image(f"{url}/missing.qcow2", "a" * 64, data)
    # a manifest whose disk is gone from the server
    (pub / "desktop.qcow2").unlink()
    with pytest.raises(RigdError, match="HTTP 404"):
        import_image(f"{url}/desktop.rigd-image.json", sha(pub / "desktop.rigd-image.json"), data)
    assert [p.name for p in images_dir(data).iterdir() if p.name != ".lock"] == []


# --------------------------------------------------------------------------- import jobs (image.import)


class _Trickle(_Quiet):
    """Serves files in 64 KiB pieces, ``server.delay`` seconds apart (with Content-Length)."""

    def copyfile(self, source: Any, outputfile: Any) -> None:
        while piece := source.read(64 << 10):
            outputfile.write(piece)
            outputfile.flush()
            time.sleep(self.server.delay)  # type: ignore[attr-defined]


class _TrickleServer(_Server):
    delay = 0.02

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a cancelled import hangs up mid-file: a broken pipe here is expected


@pytest.fixture
def trickling(tmp_path: Path) -> Iterator[tuple[str, Path, _TrickleServer]]:
    pub = tmp_path / "pub"
    pub.mkdir()
    raw = tmp_path / "disk.raw"
    raw.write_bytes(os.urandom(4 << 20))
    make_qcow2(pub / "desktop.qcow2", raw=raw)
    (pub / "vmlinux").write_bytes(fake_elf())
    (pub / "initrd.img").write_bytes(b"070701" + b"0" * 100)
    write_manifest(pub, disk=pub / "desktop.qcow2", kernel=pub / "vmlinux", initrd=pub / "initrd.img")
    srv = _TrickleServer(("127.0.0.1", 0), partial(_Trickle, directory=str(pub)))
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    try:
        yield f"http://127.0.0.1:{srv.server_port}", pub, srv
    finally:
        srv.shutdown()
        srv.server_close()
        t.join(5)


@asynccontextmanager
async def import_jobs(data: Path) -> AsyncIterator[ImportJobs]:
    jobs = ImportJobs(data, partial(which_boots, data, data / "no-cache"))
    async with trio.open_nursery() as nursery:
        await nursery.start(jobs.run)
        yield jobs
        nursery.cancel_scope.cancel()


async def _until_finished(job: ImportJob, every: float = 0.02) -> list[dict[str, Any]]:
    seen = []
    with trio.fail_after(40):
        while True:
            st = job.to_json()
            seen.append(st)
            if st["state"] != "running":
                return seen
            await trio.sleep(every)


async def test_an_import_job_reports_growing_bytes_of_a_known_total(
    trickling: tuple[str, Path, _TrickleServer], tmp_path: Path
) -> None:
    url, pub, _srv = trickling
    manifest = pub / "desktop.rigd-image.json"
    total = sum((pub / n).stat().st_size
                for n in ("desktop.rigd-image.json", "desktop.qcow2", "vmlinux", "initrd.img"))
    async with import_jobs(tmp_path / "data") as jobs:
        job = jobs.start(f"{url}/desktop.rigd-image.json", sha(manifest))
        seen = await _until_finished(job)
    done = seen[-1]
    assert done["state"] == "done", done
    assert done["bytes"] == done["totalBytes"] == total and done["image"]["boots"] is True
    running = [s for s in seen if s["state"] == "running"]
    counts = [s["bytes"] for s in running]
    assert counts == sorted(counts) and len(set(counts)) > 5  # it grows, in many steps
    fetching_disk = [s for s in running if s["phase"] == f"fetching {url}/desktop.qcow2"]
    assert fetching_disk and all(s["totalBytes"] == total for s in fetching_disk)
    assert any(0 < s["bytes"] < total for s in fetching_disk)
    assert any(s["rateBps"] for s in fetching_disk) and any(s["etaS"] is not None for s in fetching_disk)


async def test_the_first_file_s_total_is_its_content_length(
    trickling: tuple[str, Path, _TrickleServer], tmp_path: Path
) -> None:
    url, pub, srv = trickling
    srv.delay = 0
    events: list[ImportProgress] = []
    with pytest.raises(RigdError):
        await trio.to_thread.run_sync(lambda: import_image(
            f"{url}/desktop.qcow2", "f" * 64, tmp_path / "data", on_progress=events.append))
    size = (pub / "desktop.qcow2").stat().st_size
    assert {e.total_bytes for e in events} == {size}
    assert events[-1].bytes == size


async def test_an_import_job_with_a_wrong_digest_names_the_actual_one(
    trickling: tuple[str, Path, _TrickleServer], tmp_path: Path
) -> None:
    url, pub, srv = trickling
    srv.delay = 0
    data = tmp_path / "data"
    actual = sha(pub / "desktop.rigd-image.json")
    async with import_jobs(data) as jobs:
        job = jobs.start(f"{url}/desktop.rigd-image.json", "0" * 64)
        failed = (await _until_finished(job))[-1]
        assert failed["state"] == "failed"
        assert f"expected {'0' * 64}, got {actual}" in failed["error"]["message"]
        assert failed["error"]["data"] == {"source": f"{url}/desktop.rigd-image.json",
                                           "expected": "0" * 64, "actual": actual}
        # a part that changed after the manifest pinned it: the manifest's digest, and what came
        pinned = sha(pub / "desktop.qcow2")
        with (pub / "desktop.qcow2").open("r+b") as f:
            f.seek(1 << 20)
            f.write(b"changed")
        job = jobs.start(f"{url}/desktop.rigd-image.json", actual)
        failed = (await _until_finished(job))[-1]
        assert failed["state"] == "failed"
        assert failed["error"]["data"]["expected"] == pinned
        assert failed["error"]["data"]["actual"] == sha(pub / "desktop.qcow2") in failed["error"]["message"]
    assert [p.name for p in images_dir(data).iterdir() if p.name != ".lock"] == []


async def test_cancelling_an_import_job_mid_download_leaves_nothing(
    trickling: tuple[str, Path, _TrickleServer], tmp_path: Path
) -> None:
    url, pub, srv = trickling
    srv.delay = 0.05  # about 3 s for the disk
    data = tmp_path / "data"
    async with import_jobs(data) as jobs:
        job = jobs.start(f"{url}/desktop.rigd-image.json", sha(pub / "desktop.rigd-image.json"))
        with trio.fail_after(20):
            while job.to_json()["bytes"] < 1 << 20:
                await trio.sleep(0.02)
        staging = [p.name for p in images_dir(data).iterdir() if p.name.startswith(".import-")]
        assert len(staging) == 1  # it is mid-download
        t0 = trio.current_time()
        cancelled = (await jobs.cancel(job.id)).to_json()
        assert trio.current_time() - t0 < 3
        assert cancelled["state"] == "cancelled" and cancelled["error"] is None
        assert 0 < cancelled["bytes"] < cancelled["totalBytes"]
    assert [p.name for p in images_dir(data).iterdir() if p.name != ".lock"] == []
