"""The settings page's server panel over the RPC dispatcher (no sockets): desktop image
import jobs and the list of images with the one that boots, each person's clipboard
choices, and the rig audit log's pages.

Imports use small real images (a qcow2 made by ``qemu-img``, a synthetic PVH ELF) read
from a path; the HTTP cases, with bytes trickling in, are in
tests/integration/test_import_http.py. Where a test needs an import that runs until it
is stopped, the importer seam of :class:`ImportJobs` is a loop that calls ``check``.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import threading
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
import trio

from rigd.backends.fake import FakeBackend
from rigd.errors import RigdError
from rigd.images.importer import ImportedImage, ImportProgress, images_dir
from rigd.model import Accel, Surface
from rigd.rigs.manager import Caller, RigManager
from rigd.server import main as server_main
from rigd.server.imports import KEEP_JOBS, ImportJobs, rate_and_eta
from rigd.server.main import desktop_images, which_boots
from rigd.server.methods import build_methods
from rigd.server.rpc import Dispatcher
from rigd.store.aio import Stores
from tests.unit.test_images_vmlinux import fake_elf
from tests.unit.test_import import leftovers, make_qcow2, sha, write_manifest

pytestmark = pytest.mark.timeout(60)

needs_tools = pytest.mark.skipif(
    shutil.which("qemu-img") is None, reason="needs qemu-img",
)
FIELD = -32602
FORBIDDEN = -32003
CONFLICT = -32009
NOT_FOUND = -32004


class World:
    def __init__(self, tmp: Path, importer: Any = None) -> None:
        self.data = tmp / "data"
        self.stores = Stores(self.data)
        admin, ws, _ = self.stores.server.bootstrap()
        self.ws = ws
        self.admin = Caller(admin)
        bob = self.stores.server.create_user("bob", "person")
        self.stores.server.add_member(ws.id, bob.id)
        self.bob = Caller(bob)
        carol = self.stores.server.create_user("carol", "person")
        self.carol = Caller(carol)
        bot = self.stores.server.create_user("bot", "agent")
        self.stores.server.add_member(ws.id, bot.id)
        self.bot = Caller(bot)
        self.backend = FakeBackend()
        self.rigs = RigManager(self.stores, {Surface.TERMINAL: self.backend}, accel=Accel.TCG)
        # An empty cache: no desktop build waits to be imported (see test_a_pending_build_…).
        self.cache = tmp / "cache"
        self.cache.mkdir()
        kwargs = {"importer": importer} if importer is not None else {}
        self.imports = ImportJobs(self.data, functools.partial(which_boots, self.data, self.cache), **kwargs)
        self.dispatcher = Dispatcher(build_methods(self.stores, self.rigs, None, [], images=self.imports))

    async def reply(self, caller: Caller, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        msg: dict[str, Any] = {"jsonrpc": "2.0", "id": 1, "method": method}
        if params is not None:
            msg["params"] = params
        reply = await self.dispatcher.handle(caller, msg)
        assert reply is not None
        return reply

    async def ok(self, caller: Caller, method: str, params: dict[str, Any] | None = None) -> Any:
        reply = await self.reply(caller, method, params)
        assert "error" not in reply, reply
        return reply["result"]

    async def err(self, caller: Caller, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        reply = await self.reply(caller, method, params)
        assert "error" in reply, reply
        error: dict[str, Any] = reply["error"]
        return error

    async def finished(self, import_id: str) -> dict[str, Any]:
        with trio.fail_after(30):
            while True:
                st: dict[str, Any] = await self.ok(self.admin, "image.importStatus", {"importId": import_id})
                if st["state"] != "running":
                    return st
                await trio.sleep(0.02)


async def _world(tmp_path: Path, importer: Any = None) -> AsyncIterator[World]:
    w = World(tmp_path, importer)
    async with trio.open_nursery() as nursery:
        await nursery.start(w.rigs.run)
        await nursery.start(w.imports.run)
        yield w
        nursery.cancel_scope.cancel()
    w.stores.close()


@pytest.fixture
async def world(tmp_path: Path) -> AsyncIterator[World]:
    async for w in _world(tmp_path):
        yield w


class Endless:
    """An importer that fetches forever, one 'chunk' per 10 ms, until its check raises.

    ``release`` lets every running call finish with a RigdError instead.
    """

    def __init__(self) -> None:
        self.release = threading.Event()
        self.stopped = threading.Event()

    def __call__(self, source: str, sha256: str, data_dir: Path, *, progress: Callable[[str], None],
                 on_progress: Callable[[ImportProgress], None], check: Callable[[], None]) -> ImportedImage:
        n = 0
        try:
            while not self.release.is_set():
                check()
                n += 1000
                on_progress(ImportProgress(f"fetching {source}", n, 10**9))
                time.sleep(0.01)
        finally:
            self.stopped.set()
        raise RigdError("released")


@pytest.fixture
def endless() -> Endless:
    return Endless()


@pytest.fixture
async def slow_world(tmp_path: Path, endless: Endless) -> AsyncIterator[World]:
    async for w in _world(tmp_path, endless):
        yield w
    endless.release.set()


@pytest.fixture
def published(tmp_path: Path) -> Path:
    """A publisher's directory: a manifest and the qcow2, kernel and initramfs it pins."""
    pub = tmp_path / "pub"
    pub.mkdir()
    raw = tmp_path / "disk.raw"
    raw.write_bytes(os.urandom(3 << 20))  # a qcow2 of a few MiB, so progress has chunks to count
    make_qcow2(pub / "desktop.qcow2", raw=raw)
    (pub / "vmlinux").write_bytes(fake_elf())
    (pub / "initrd.img").write_bytes(b"070701" + b"0" * 200)
    write_manifest(pub, disk=pub / "desktop.qcow2", kernel=pub / "vmlinux", initrd=pub / "initrd.img")
    return pub


def republish(pub: Path, dest: Path, **over: object) -> Path:
    """Another image (a different manifest) with the same files."""
    dest.mkdir()
    for name in ("desktop.qcow2", "vmlinux", "initrd.img"):
        shutil.copyfile(pub / name, dest / name)
    return write_manifest(dest, disk=dest / "desktop.qcow2", kernel=dest / "vmlinux",
                          initrd=dest / "initrd.img", **over)


# --------------------------------------------------------------------------- image.import: input


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"sha256": "a" * 64}, "source"),
        ({"source": "", "sha256": "a" * 64}, "source"),
        ({"source": "/x" * 3000, "sha256": "a" * 64}, "source"),
        ({"source": 7, "sha256": "a" * 64}, "source"),
        ({"source": " /tmp/x.json", "sha256": "a" * 64}, "source"),
        ({"source": "/nonexistent/rigd-image.json", "sha256": "a" * 64}, "source"),
        ({"source": "ftp://example.org/x.qcow2", "sha256": "a" * 64}, "source"),
        ({"source": "http:///x.qcow2", "sha256": "a" * 64}, "source"),
        ({"source": "/etc/hostname"}, "sha256"),
        ({"source": "/etc/hostname", "sha256": "abc"}, "sha256"),
        ({"source": "/etc/hostname", "sha256": "g" * 64}, "sha256"),
        ({"source": "/etc/hostname", "sha256": 12}, "sha256"),
        ({"source": "/etc/hostname", "sha256": "a" * 64, "name": "x"}, "name"),
    ],
)
async def test_import_refuses_bad_fields_at_once(world: World, params: dict[str, Any], field: str) -> None:
    err = await world.err(world.admin, "image.import", params)
    assert err["code"] == FIELD and err["data"]["field"] == field
    assert world.imports.running() == []


async def test_the_import_methods_are_for_admins(world: World) -> None:
    for caller in (world.bob, world.bot):
        for method, params in (("image.import", {"source": "/etc/hostname", "sha256": "a" * 64}),
                               ("image.importStatus", {"importId": "imp_x"}),
                               ("image.importCancel", {"importId": "imp_x"}),
                               ("clipboard.policy.list", {})):
            err = await world.err(caller, method, params)
            assert err["code"] == FORBIDDEN and "admins only" in err["message"], (caller, method)


async def test_unknown_and_malformed_import_ids(world: World) -> None:
    err = await world.err(world.admin, "image.importStatus", {"importId": "imp_nosuch"})
    assert err["code"] == NOT_FOUND and err["data"]["field"] == "importId"
    err = await world.err(world.admin, "image.importCancel", {"importId": "imp_nosuch"})
    assert err["code"] == NOT_FOUND
    for bad in ({}, {"importId": ""}, {"importId": "a b"}, {"importId": "imp_1", "x": 1}):
        err = await world.err(world.admin, "image.importStatus", bad)
        assert err["code"] == FIELD


async def test_without_an_import_service_the_methods_say_so(tmp_path: Path) -> None:
    stores = Stores(tmp_path)
    admin, _ws, _ = stores.server.bootstrap()
    rigs = RigManager(stores, {Surface.TERMINAL: FakeBackend()}, accel=Accel.TCG)
    dispatcher = Dispatcher(build_methods(stores, rigs, None, []))
    reply = await dispatcher.handle(Caller(admin), {"jsonrpc": "2.0", "id": 1, "method": "image.list"})
    assert reply is not None and reply["error"]["data"]["field"] == "method"
    assert "no image imports" in reply["error"]["message"]
    stores.close()


# --------------------------------------------------------------------------- image.import: real imports


@needs_tools
async def test_import_runs_in_the_background_and_reports_bytes(world: World, published: Path) -> None:
    manifest = published / "desktop.rigd-image.json"
    started = await world.ok(world.admin, "image.import", {"source": str(manifest),
                                                          "sha256": sha(manifest.read_bytes())})
    assert started["state"] == "running" and started["importId"].startswith("imp_")
    assert started["source"] == str(manifest) and started["error"] is None and started["image"] is None
    done = await world.finished(started["importId"])
    assert done["state"] == "done", done
    files = [manifest, published / "desktop.qcow2", published / "vmlinux", published / "initrd.img"]
    total = sum(f.stat().st_size for f in files)
    assert done["bytes"] == done["totalBytes"] == total
    assert done["etaS"] == 0 and done["phase"] == "done" and done["alreadyPresent"] is False
    image = done["image"]
    assert image["sha256"] == sha(manifest.read_bytes()) and image["boots"] is True
    assert image["bytes"] == (published / "desktop.qcow2").stat().st_size
    assert image["guestProtocol"] == 2 and image["display"] == {"width": 1280, "height": 800}
    assert image["surface"] == "computer" and image["kernelRelease"] == "6.1.0-57-amd64"
    assert image["dir"] == str(images_dir(world.data) / f"sha256-{image['sha256']}")
    assert image["importedAt"].endswith("Z")
    assert leftovers(world.data) == [f"sha256-{image['sha256']}"]


@needs_tools
async def test_a_wrong_digest_fails_the_job_naming_both_digests(world: World, published: Path) -> None:
    manifest = published / "desktop.rigd-image.json"
    actual = sha(manifest.read_bytes())
    wrong = "0" * 64
    started = await world.ok(world.admin, "image.import", {"source": str(manifest), "sha256": f"sha256:{wrong}"})
    failed = await world.finished(started["importId"])
    assert failed["state"] == "failed" and failed["image"] is None
    assert wrong in failed["error"]["message"] and actual in failed["error"]["message"]
    assert failed["error"]["data"]["expected"] == wrong and failed["error"]["data"]["actual"] == actual
    assert leftovers(world.data) == []  # the staging directory is gone
    assert await world.ok(world.admin, "image.list") == []


@needs_tools
async def test_image_list_marks_the_newest_import_as_the_one_that_boots(
    world: World, published: Path, tmp_path: Path
) -> None:
    assert await world.ok(world.bob, "image.list") == []
    first = published / "desktop.rigd-image.json"
    second = republish(published, tmp_path / "pub2", display={"width": 1920, "height": 1080})
    a = await world.finished((await world.ok(world.admin, "image.import", {
        "source": str(first), "sha256": sha(first.read_bytes())}))["importId"])
    os.utime(a["image"]["dir"], ns=(1, 1))  # an old import, whatever the clock's resolution
    b = await world.finished((await world.ok(world.admin, "image.import", {
        "source": f"file://{second}", "sha256": sha(second.read_bytes())}))["importId"])
    assert a["state"] == b["state"] == "done"
    assert b["image"]["boots"] is True
    listed = await world.ok(world.bob, "image.list")  # any member may list
    assert {i["sha256"]: i["boots"] for i in listed} == {a["image"]["sha256"]: False, b["image"]["sha256"]: True}
    assert [i["display"] for i in listed if i["boots"]] == [{"width": 1920, "height": 1080}]
    # what a computer rig boots is the image image.list marks
    booted = await trio.to_thread.run_sync(desktop_images(world.data, world.cache), lambda _m: None)
    assert booted is not None and booted.sha256 == b["image"]["sha256"]
    # importing the same digest again is done at once, and says so
    again = await world.finished((await world.ok(world.admin, "image.import", {
        "source": str(first), "sha256": sha(first.read_bytes())}))["importId"])
    assert again["state"] == "done" and again["alreadyPresent"] is True and again["image"]["boots"] is False
    err = await world.err(world.admin, "image.list", {"all": True})
    assert err["code"] == FIELD and err["data"]["field"] == "all"


@needs_tools
async def test_a_pending_desktop_build_is_what_boots(
    world: World, published: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A desktop build in the cache not imported yet: the next rig imports and boots it, so
    image.list marks no import until then and lists the build itself (issue 26: the page said
    "no desktop image yet" right after `make run` built one) — and marks the import after."""
    first = published / "desktop.rigd-image.json"
    await world.finished((await world.ok(world.admin, "image.import", {
        "source": str(first), "sha256": sha(first.read_bytes())}))["importId"])
    built = republish(published, tmp_path / "built", proto=3)

    class Built:
        manifest_path = built

    monkeypatch.setattr(server_main, "find_desktop", lambda _cache: Built())
    listed = await world.ok(world.admin, "image.list")
    # The import does not boot; the build is listed after it, as built and imported on first use.
    assert [(i["state"], i["boots"]) for i in listed] == [("imported", False), ("built", True)]
    assert listed[1]["sha256"] == sha(built.read_bytes()) and listed[1]["importedAt"] is None
    assert listed[1]["guestProtocol"] == 3 and "imported when the first desktop opens" in listed[1]["note"]
    booted = await trio.to_thread.run_sync(desktop_images(world.data, world.cache), lambda _m: None)
    assert booted is not None and booted.sha256 == sha(built.read_bytes()) and booted.guest_protocol == 3
    listed = await world.ok(world.admin, "image.list")
    assert [i["sha256"] for i in listed if i["boots"]] == [booted.sha256]
    assert len(listed) == 2


# --------------------------------------------------------------------------- jobs: cancel, limits, memory


async def test_cancel_stops_a_running_import(slow_world: World, endless: Endless) -> None:
    w = slow_world
    started = await w.ok(w.admin, "image.import", {"source": "/etc/hostname", "sha256": "a" * 64})
    with trio.fail_after(10):
        while (st := await w.ok(w.admin, "image.importStatus", {"importId": started["importId"]}))["bytes"] < 5000:
            await trio.sleep(0.02)
    assert st["state"] == "running" and st["totalBytes"] == 10**9 and st["phase"] == "fetching /etc/hostname"
    cancelled = await w.ok(w.admin, "image.importCancel", {"importId": started["importId"]})
    assert cancelled["state"] == "cancelled" and cancelled["cancelRequested"] is True
    assert cancelled["rateBps"] is None and cancelled["etaS"] is None and cancelled["error"] is None
    assert endless.stopped.is_set()
    # cancelling again answers the finished job as it is
    again = await w.ok(w.admin, "image.importCancel", {"importId": started["importId"]})
    assert again["state"] == "cancelled"


async def test_rate_and_eta_while_running(slow_world: World) -> None:
    w = slow_world
    started = await w.ok(w.admin, "image.import", {"source": "/etc/hostname", "sha256": "a" * 64})
    with trio.fail_after(10):
        while (st := await w.ok(w.admin, "image.importStatus", {"importId": started["importId"]}))["rateBps"] is None:
            await trio.sleep(0.05)
    assert st["rateBps"] > 0 and st["etaS"] > 0


async def test_at_most_two_imports_run_at_once(slow_world: World, endless: Endless) -> None:
    w = slow_world
    a = await w.ok(w.admin, "image.import", {"source": "/etc/hostname", "sha256": "a" * 64})
    err = await w.err(w.admin, "image.import", {"source": "/etc/hostname", "sha256": "A" * 64})
    assert err["code"] == CONFLICT and err["data"]["importId"] == a["importId"]  # the same digest
    b = await w.ok(w.admin, "image.import", {"source": "/etc/hostname", "sha256": "b" * 64})
    err = await w.err(w.admin, "image.import", {"source": "/etc/hostname", "sha256": "c" * 64})
    assert err["code"] == CONFLICT and "at most 2 imports" in err["message"]
    assert sorted(err["data"]["running"]) == sorted([a["importId"], b["importId"]])
    await w.ok(w.admin, "image.importCancel", {"importId": a["importId"]})
    c = await w.ok(w.admin, "image.import", {"source": "/etc/hostname", "sha256": "c" * 64})
    assert c["state"] == "running"


async def test_the_last_twenty_jobs_are_kept(tmp_path: Path) -> None:
    def failing(*_args: Any, **_kw: Any) -> ImportedImage:
        raise RigdError("no")

    async for w in _world(tmp_path, failing):
        ids = []
        for i in range(KEEP_JOBS + 1):
            started = await w.ok(w.admin, "image.import", {"source": "/etc/hostname", "sha256": f"{i:064x}"})
            failed = await w.finished(started["importId"])
            assert failed["state"] == "failed" and failed["error"] == {"message": "no", "data": {}}
            ids.append(started["importId"])
        err = await w.err(w.admin, "image.importStatus", {"importId": ids[0]})
        assert err["code"] == NOT_FOUND
        for kept in ids[1:]:
            assert (await w.ok(w.admin, "image.importStatus", {"importId": kept}))["state"] == "failed"


def test_rate_and_eta_are_unknown_until_they_can_be_told() -> None:
    assert rate_and_eta([], 10.0, 100) == (None, None)
    assert rate_and_eta([(10.0, 0), (10.2, 50)], 10.3, 100) == (None, None)  # too short to tell
    assert rate_and_eta([(10.0, 0), (11.0, 50)], 11.0, 150) == (50, 2)
    assert rate_and_eta([(10.0, 0), (11.0, 50)], 11.0, None) == (50, None)  # no total
    assert rate_and_eta([(10.0, 50)], 20.0, 150) == (0, None)  # stalled


# --------------------------------------------------------------------------- clipboard.policy.list


async def test_clipboard_policy_list_shows_every_person_with_defaults(world: World) -> None:
    await world.ok(world.bob, "clipboard.policy.set", {"rigToHost": "allow", "hostToRig": "deny"})
    rows = await world.ok(world.admin, "clipboard.policy.list")
    by_name = {r["user"]["name"]: r for r in rows}
    assert sorted(by_name) == ["admin", "bob", "carol"]  # persons only: the agent has no choices
    assert by_name["bob"]["user"] == {"id": world.bob.user.id, "name": "bob"}
    assert (by_name["bob"]["hostToRig"], by_name["bob"]["rigToHost"]) == ("deny", "allow")
    assert by_name["bob"]["updatedAt"] is not None
    assert (by_name["carol"]["hostToRig"], by_name["carol"]["rigToHost"]) == ("allow", "ask")  # defaults
    assert by_name["carol"]["updatedAt"] is None and by_name["carol"]["grants"] == []
    # the same as each person sees for themself
    mine = await world.ok(world.bob, "clipboard.policy.get")
    assert {k: by_name["bob"][k] for k in mine} == mine
    err = await world.err(world.admin, "clipboard.policy.list", {"user": "bob"})
    assert err["code"] == FIELD and err["data"]["field"] == "user"


async def test_clipboard_policy_list_shows_live_grants(world: World) -> None:
    rig = await world.ok(world.bob, "rig.open", {"workspace": "default", "surface": "terminal"})
    granted = await world.ok(world.bob, "clipboard.grant", {"rigId": rig["id"]})
    rows = await world.ok(world.admin, "clipboard.policy.list")
    bob = next(r for r in rows if r["user"]["name"] == "bob")
    assert bob["grants"] == [{"rigId": rig["id"], "until": granted["until"]}]
    assert all(r["grants"] == [] for r in rows if r["user"]["name"] != "bob")


# --------------------------------------------------------------------------- rig.log pages


async def _rig_with_actions(w: World, n: int, secret: str | None = None) -> tuple[str, int]:
    rig = await w.ok(w.admin, "rig.open", {"workspace": "default", "surface": "terminal"})
    for i in range(n):
        action: dict[str, Any] = {"action": "exec", "argv": ["echo", str(i)]}
        if secret is not None:
            action["stdin"] = secret
        await w.ok(w.admin, "rig.act", {"rigId": rig["id"], "tool": "terminal_use", "action": action})
    return rig["id"], n + 1  # and the open row


async def test_rig_log_pages_newest_first_and_back(world: World) -> None:
    rig, rows = await _rig_with_actions(world, 11)
    newest = await world.ok(world.admin, "rig.log", {"rigId": rig, "beforeSeq": 2**53 - 1, "limit": 5})
    assert [r["seq"] for r in newest] == [12, 11, 10, 9, 8]
    back = await world.ok(world.admin, "rig.log", {"rigId": rig, "beforeSeq": newest[-1]["seq"], "limit": 5})
    assert [r["seq"] for r in back] == [7, 6, 5, 4, 3]
    last = await world.ok(world.admin, "rig.log", {"rigId": rig, "beforeSeq": back[-1]["seq"], "limit": 5})
    assert [r["seq"] for r in last] == [2, 1]  # fewer than the limit, and seq 1: the first page
    assert last[-1]["verb"] == "open"
    # the old way, oldest first from a seq, with a limit now
    forward = await world.ok(world.admin, "rig.log", {"rigId": rig, "afterSeq": 9, "limit": 2})
    assert [r["seq"] for r in forward] == [10, 11]
    assert [r["seq"] for r in await world.ok(world.admin, "rig.log", {"rigId": rig})] == list(range(1, rows + 1))
    # both bounds: the newest rows strictly between them
    window = await world.ok(world.admin, "rig.log", {"rigId": rig, "afterSeq": 3, "beforeSeq": 7})
    assert [r["seq"] for r in window] == [6, 5, 4]


async def test_rig_log_without_a_limit_answers_what_it_always_did(world: World) -> None:
    """Unpaged callers see no change: up to 1000 rows, oldest first."""
    rig, _rows = await _rig_with_actions(world, 104)
    page = await world.ok(world.admin, "rig.log", {"rigId": rig})
    assert [r["seq"] for r in page] == list(range(1, 106))
    page = await world.ok(world.admin, "rig.log", {"rigId": rig, "limit": 100})
    assert [r["seq"] for r in page] == list(range(1, 101))


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"limit": 0}, "limit"),
        ({"limit": 1001}, "limit"),
        ({"limit": "10"}, "limit"),
        ({"limit": True}, "limit"),
        ({"beforeSeq": 0}, "beforeSeq"),
        ({"beforeSeq": -1}, "beforeSeq"),
        ({"beforeSeq": 2**53}, "beforeSeq"),
        ({"beforeSeq": "9"}, "beforeSeq"),
        ({"afterSeq": -1}, "afterSeq"),
        ({"afterSeq": 2**70}, "afterSeq"),
        ({"page": 2}, "page"),
    ],
)
async def test_rig_log_refuses_bad_paging(world: World, params: dict[str, Any], field: str) -> None:
    rig = await world.ok(world.admin, "rig.open", {"workspace": "default", "surface": "terminal"})
    err = await world.err(world.admin, "rig.log", {"rigId": rig["id"], **params})
    assert err["code"] == FIELD and err["data"]["field"] == field


async def test_rig_log_pages_keep_typed_values_masked(world: World) -> None:
    secret = "correct-horse-battery-staple"
    rig, _rows = await _rig_with_actions(world, 3, secret=secret)
    page = await world.ok(world.admin, "rig.log", {"rigId": rig, "beforeSeq": 2**53 - 1, "limit": 2})
    assert secret not in json.dumps(page)
    assert [r["args"]["stdin"] for r in page] == [{"len": len(secret), "sha256": sha(secret.encode())}] * 2


async def test_rig_log_pages_only_for_those_who_see_the_rig(world: World) -> None:
    rig, _rows = await _rig_with_actions(world, 1)
    err = await world.err(world.carol, "rig.log", {"rigId": rig, "beforeSeq": 10})
    assert err["code"] == NOT_FOUND
