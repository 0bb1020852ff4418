"""The clipboard and file lanes (rigd.server.lanes) as an ASGI app over the fake backend:
no sockets — each request is a call of the app with its ``receive``/``send``."""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import trio

from rigd.auth import Signer
from rigd.backends.fake import FakeBackend, FakeLanes
from rigd.backends.lanes import Clip, DropTarget
from rigd.model import Accel, Surface
from rigd.rigs.api import RigApi
from rigd.rigs.manager import Caller, RigManager
from rigd.server.app import ServerContext
from rigd.server.lanes import LaneRouter, content_disposition
from rigd.server.methods import build_methods
from rigd.server.rpc import Dispatcher
from rigd.store.aio import Stores

pytestmark = pytest.mark.trio
BOUNDARY = "rigdtestboundary"


class World:
    def __init__(self, tmp: Path) -> None:
        self.stores = Stores(tmp)
        admin, ws, _ = self.stores.server.bootstrap()
        self.ws = ws
        self.admin = Caller(admin)
        self.token = self.stores.server.create_token(admin.id, "t")
        bob = self.stores.server.create_user("bob", "person")
        self.stores.server.add_member(ws.id, bob.id)
        self.bob = Caller(bob)
        self.bob_token = self.stores.server.create_token(bob.id, "t")
        bot = self.stores.server.create_user("bot", "agent")
        self.stores.server.add_member(ws.id, bot.id)
        self.bot_token = self.stores.server.create_token(bot.id, "t")
        self.terminal, self.computer = FakeBackend(), FakeBackend()
        self.rigs = RigManager(self.stores, {Surface.TERMINAL: self.terminal,
                                             Surface.COMPUTER: self.computer}, accel=Accel.TCG)
        self.api = RigApi(self.rigs)
        self.signer = Signer(b"k" * 32)
        self.methods = build_methods(self.stores, self.rigs, self.signer, ["http://127.0.0.1:1"])
        ctx = ServerContext(self.stores, self.rigs, Dispatcher(self.methods), self.signer)

        async def not_a_lane(scope: Any, receive: Any, send: Any) -> None:
            raise AssertionError(f"{scope['path']} reached the Quart app")

        self.app = LaneRouter(not_a_lane, ctx)

    async def rpc(self, caller: Caller, method: str, params: dict[str, Any]) -> Any:
        return await self.methods[method].handler(caller, params)

    async def open(self, surface: str) -> tuple[str, FakeLanes]:
        rig = await self.api.call("rig.open", self.admin, {"workspace": "default", "surface": surface})
        backend = self.terminal if surface == "terminal" else self.computer
        return rig["id"], backend.machines[-1].lanes()

    async def http(self, method: str, path: str, *, query: str = "", token: str | None = "admin",
                   headers: dict[str, str] | None = None, body: list[bytes] | None = None,
                   disconnect_after: int | None = None) -> tuple[int, dict[str, str], bytes]:
        hdrs = dict(headers or {})
        if token is not None:
            hdrs["Authorization"] = "Bearer " + {"admin": self.token, "bob": self.bob_token,
                                                  "bot": self.bot_token}.get(token, token)
        chunks = list(body or [b""])
        scope = {"type": "http", "method": method, "path": path, "query_string": query.encode(),
                 "headers": [(k.lower().encode(), v.encode()) for k, v in hdrs.items()]}
        sent: list[dict[str, Any]] = []
        calls = 0

        async def receive() -> dict[str, Any]:
            nonlocal calls
            await trio.lowlevel.checkpoint()
            calls += 1
            if disconnect_after is not None and calls > disconnect_after:
                return {"type": "http.disconnect"}
            if not chunks:  # the whole request is in: as an ASGI server does, wait for the client to go
                await trio.sleep_forever()
            chunk = chunks.pop(0)
            return {"type": "http.request", "body": chunk, "more_body": bool(chunks)}

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)

        with trio.fail_after(10):
            await self.app(scope, receive, send)
        if not sent:
            return 0, {}, b""
        start = sent[0]
        head = {k.decode(): v.decode() for k, v in start["headers"]}
        return start["status"], head, b"".join(m.get("body", b"") for m in sent[1:])


def multipart(files: list[tuple[str, bytes]], part_headers: list[dict[str, str]] | None = None) -> bytes:
    out = bytearray()
    for i, (name, data) in enumerate(files):
        out += f"--{BOUNDARY}\r\n".encode()
        out += f'Content-Disposition: form-data; name="file"; filename="{name}"\r\n'.encode()
        for k, v in (part_headers[i] if part_headers else {}).items():
            out += f"{k}: {v}\r\n".encode()
        out += b"Content-Type: application/octet-stream\r\n\r\n" + data + b"\r\n"
    out += f"--{BOUNDARY}--\r\n".encode()
    return bytes(out)


MP = {"Content-Type": f"multipart/form-data; boundary={BOUNDARY}"}


def in_pieces(data: bytes, size: int = 7000) -> list[bytes]:
    return [data[i:i + size] for i in range(0, len(data), size)]


@pytest.fixture
async def world(tmp_path: Path) -> AsyncIterator[World]:
    """A running lanes world (also the fixture of test_session and test_pages, via conftest)."""
    w = World(tmp_path)
    async with trio.open_nursery() as nursery:
        await nursery.start(w.rigs.run)
        yield w
        nursery.cancel_scope.cancel()


def b64url(path: str) -> str:
    return base64.urlsafe_b64encode(path.encode()).decode().rstrip("=")


async def test_a_terminal_drop_saves_every_file_and_renames_a_collision(world: World) -> None:
    rig_id, lanes = await world.open("terminal")
    lanes.files["/root/drops/notes.txt"] = b"already there"
    big = bytes(range(256)) * 4000
    body = multipart([("notes.txt", b"new notes"), ("résumé 2.pdf", big), ("c.bin", b"")])
    status, _h, out = await world.http("POST", f"/rig/files/{rig_id}", headers=MP, body=in_pieces(body))
    assert status == 200, out
    answer = json.loads(out)
    assert answer["told"] == "none" and answer["dir"] == "/root/drops"
    assert [s["path"] for s in answer["saved"]] == [
        "/root/drops/2-notes.txt", "/root/drops/résumé 2.pdf", "/root/drops/c.bin"]
    assert answer["saved"][1]["sha256"] == hashlib.sha256(big).hexdigest()
    assert answer["saved"][1]["bytes"] == len(big)
    assert lanes.files["/root/drops/notes.txt"] == b"already there"
    assert lanes.files["/root/drops/résumé 2.pdf"] == big
    rows = await world.api.call("rig.log", world.admin, {"rigId": rig_id})
    drop = next(r for r in rows if r["verb"] == "drop_files")
    text = json.dumps(drop)
    assert drop["args"]["count"] == 3 and drop["args"]["bytes"] == len(big) + 9
    assert "new notes" not in text and "/root/drops/2-notes.txt" in text


async def test_a_desktop_drop_puts_the_files_uris_on_the_clipboard(world: World) -> None:
    rig_id, lanes = await world.open("computer")
    body = multipart([("résumé 2.pdf", b"%PDF-1.4")])
    status, _h, out = await world.http("POST", f"/rig/files/{rig_id}", query="x=10&y=20", headers=MP,
                                       body=[body])
    assert status == 200, out
    assert json.loads(out)["told"] == "clipboard"
    clip = lanes.selections["clipboard"]
    assert clip.media_type == "text/uri-list"
    assert clip.data == b"file:///home/rig/Drops/r%C3%A9sum%C3%A9%202.pdf\r\n"


async def test_a_page_that_takes_drop_events_gets_the_saved_files_at_the_point(world: World) -> None:
    rig_id, lanes = await world.open("computer")
    # A browser rig's lanes: files land in /tmp/cc-drops and the page is told by a drop event.
    lanes.target = DropTarget(dir="/tmp/cc-drops", owner="browser", told="drop-event")
    dropped: list[tuple[list[str], tuple[int, int] | None]] = []

    async def drop_event(paths: list[str], point: tuple[int, int] | None) -> None:
        dropped.append((paths, point))

    lanes.drop_event = drop_event
    body = multipart([("a.txt", b"one"), ("b.txt", b"two")])
    status, _h, out = await world.http("POST", f"/rig/files/{rig_id}", query="x=30&y=40", headers=MP,
                                       body=[body])
    assert status == 200, out
    assert json.loads(out)["told"] == "drop-event"
    assert dropped == [(["/tmp/cc-drops/a.txt", "/tmp/cc-drops/b.txt"], (30, 40))]
    assert "clipboard" not in lanes.selections
    row = next(r for r in await world.api.call("rig.log", world.admin, {"rigId": rig_id})
               if r["verb"] == "drop_files")
    assert row["args"]["told"] == "drop-event"


@pytest.mark.parametrize(("name", "reason"), [
    ("a/b", "'/'"), ("..", "not a file name"), (".", "not a file name"), ("x\x01y", "control"),
    ("n" * 256, "255 bytes"),
])
async def test_bad_names_are_field_errors_naming_the_part(world: World, name: str, reason: str) -> None:
    rig_id, lanes = await world.open("terminal")
    body = multipart([("fine.txt", b"ok"), (name, b"x")])
    status, _h, out = await world.http("POST", f"/rig/files/{rig_id}", headers=MP, body=[body])
    assert status == 400, out
    data = json.loads(out)["error"]["data"]
    assert data["field"] == "files[1].name" and reason in data["reason"]
    assert lanes.files == {}


async def test_a_wrong_declared_digest_aborts_the_whole_drop(world: World) -> None:
    rig_id, lanes = await world.open("terminal")
    wrong = base64.b64encode(hashlib.sha256(b"other").digest()).decode()
    right = base64.b64encode(hashlib.sha256(b"one").digest()).decode()
    body = multipart([("one", b"one"), ("two", b"two")],
                     [{"Repr-Digest": f"sha-256=:{right}:"}, {"Repr-Digest": f"sha-256=:{wrong}:"}])
    status, _h, out = await world.http("POST", f"/rig/files/{rig_id}", headers=MP, body=[body])
    assert status == 400
    assert json.loads(out)["error"]["data"]["field"] == "files[1].digest"
    assert lanes.files == {}


async def test_sizes_counts_and_framing_are_refused(world: World) -> None:
    rig_id, lanes = await world.open("terminal")
    too_many = multipart([(f"f{i}", b"x") for i in range(65)])
    status, _h, out = await world.http("POST", f"/rig/files/{rig_id}", headers=MP, body=[too_many])
    assert status == 400 and json.loads(out)["error"]["data"]["field"] == "files"
    status, _h, out = await world.http("POST", f"/rig/files/{rig_id}",
                                       headers={**MP, "Content-Length": str(600 * 1024 * 1024)},
                                       body=[b"--"])
    assert status == 413 and "512 MB" in json.loads(out)["error"]["message"]
    status, _h, out = await world.http("POST", f"/rig/files/{rig_id}",
                                       headers={"Content-Type": "application/json"}, body=[b"{}"])
    assert status == 400 and json.loads(out)["error"]["data"]["field"] == "Content-Type"
    cut = multipart([("a", b"abc")])[:-20]
    status, _h, out = await world.http("POST", f"/rig/files/{rig_id}", headers=MP, body=[cut])
    assert status == 400 and json.loads(out)["error"]["data"]["field"] == "body"
    status, _h, out = await world.http("POST", f"/rig/files/{rig_id}", query="x=1", headers=MP,
                                       body=[multipart([("a", b"1")])])
    assert status == 400 and json.loads(out)["error"]["data"]["field"] == "x"
    assert lanes.files == {}


async def test_a_client_that_goes_away_mid_upload_leaves_nothing(world: World) -> None:
    rig_id, lanes = await world.open("terminal")
    body = multipart([("a.bin", b"a" * 100_000), ("b.bin", b"b" * 100_000)])
    status, _h, _out = await world.http("POST", f"/rig/files/{rig_id}", headers=MP,
                                        body=in_pieces(body), disconnect_after=20)
    assert status == 0
    assert lanes.files == {}


async def test_writes_respect_anothers_control_and_reads_do_not(world: World) -> None:
    rig_id, lanes = await world.open("computer")
    lanes.files["/home/rig/f.txt"] = b"hello"
    await world.api.call("rig.control", world.bob, {"rigId": rig_id, "op": "take"})
    status, _h, out = await world.http("POST", f"/rig/files/{rig_id}", headers=MP,
                                       body=[multipart([("a", b"1")])])
    assert status == 409 and "hand control back" in json.loads(out)["error"]["message"]
    status, _h, out = await world.http("POST", f"/rig/clipboard/{rig_id}",
                                       headers={"Content-Type": "text/plain"}, body=[b"hi"])
    assert status == 409
    status, _h, out = await world.http("GET", f"/rig/files/{rig_id}", query=f"p={b64url('/home/rig/f.txt')}")
    assert status == 200 and out == b"hello"
    # The one holding control writes.
    status, _h, out = await world.http("POST", f"/rig/files/{rig_id}", token="bob", headers=MP,
                                       body=[multipart([("a", b"1")])])
    assert status == 200, out


async def test_signatures_are_scoped_and_agents_are_refused(world: World) -> None:
    rig_id, lanes = await world.open("terminal")
    lanes.files["/root/x"] = b"x"
    p = b64url("/root/x")
    signed = await world.rpc(world.admin, "rig.filesUrl", {"rigId": rig_id})
    assert signed["path"].startswith(f"/rig/files/{rig_id}?") and signed["clipboardPath"].startswith(
        f"/rig/clipboard/{rig_id}?")
    query = signed["path"].split("?", 1)[1]
    status, _h, out = await world.http("GET", f"/rig/files/{rig_id}", query=f"{query}&p={p}", token=None)
    assert status == 200 and out == b"x"
    view = world.signer.sign("rig-view", world.ws.id, rig_id, world.admin.user.id)
    status, _h, _out = await world.http(
        "POST", f"/rig/files/{rig_id}", token=None, headers=MP, body=[multipart([("a", b"1")])],
        query=f"u={view['u']}&exp={view['exp']}&sig={view['sig']}")
    assert status == 401
    status, _h, out = await world.http("GET", f"/rig/files/{rig_id}", query=f"p={p}", token="bot")
    assert status == 403 and "for people" in json.loads(out)["error"]["message"]
    assert (await world.http("GET", f"/rig/files/{rig_id}", query=f"p={p}", token="nope"))[0] == 401


async def test_a_file_goes_out_with_its_length_digest_and_name(world: World) -> None:
    rig_id, lanes = await world.open("terminal")
    data = b"\x00\x01" * 100_000
    lanes.files["/root/out/résumé 2.pdf"] = data
    status, head, out = await world.http("GET", f"/rig/files/{rig_id}",
                                         query=f"p={b64url('/root/out/résumé 2.pdf')}")
    assert status == 200 and out == data
    assert head["content-length"] == str(len(data))
    assert head["repr-digest"] == "sha-256=:" + base64.b64encode(hashlib.sha256(data).digest()).decode() + ":"
    assert head["content-disposition"] == content_disposition("résumé 2.pdf")
    assert "filename*=UTF-8''r%C3%A9sum%C3%A9%202.pdf" in head["content-disposition"]
    for bad, reason in (("", "base64url"), ("a b", "base64url"), (b64url("rel/x"), "absolute"),
                        (b64url("/root/out"), "directory")):
        status, _h, out = await world.http("GET", f"/rig/files/{rig_id}", query=f"p={bad}")
        assert status == 400, (bad, out)
        err = json.loads(out)["error"]["data"]
        assert err["field"] == "p" and reason in err["reason"], err
    rows = await world.api.call("rig.log", world.admin, {"rigId": rig_id})
    read = [r for r in rows if r["verb"] == "read_file" and r["outcome"] == "ok"]
    assert read[0]["args"] == {"path": "/root/out/résumé 2.pdf", "bytes": len(data)}


async def test_copy_out_asks_first_then_works_after_a_grant(world: World) -> None:
    rig_id, lanes = await world.open("computer")
    lanes.selections["clipboard"] = Clip("text/plain", "héllo".encode())
    status, _h, out = await world.http("GET", f"/rig/clipboard/{rig_id}")
    assert status == 403
    data = json.loads(out)["error"]["data"]
    assert data["field"] == "clipboard" and data["ask"] is True
    granted = await world.rpc(world.admin, "clipboard.grant", {"rigId": rig_id})
    assert granted["rigId"] == rig_id
    status, head, out = await world.http("GET", f"/rig/clipboard/{rig_id}")
    assert status == 200 and out == "héllo".encode() and head["content-type"] == "text/plain; charset=utf-8"
    policy = await world.rpc(world.admin, "clipboard.policy.get", {})
    assert policy["rigToHost"] == "ask" and policy["hostToRig"] == "allow"
    assert [g["rigId"] for g in policy["grants"]] == [rig_id]
    # Bob's choices are his own: he was never granted anything.
    assert (await world.http("GET", f"/rig/clipboard/{rig_id}", token="bob"))[0] == 403
    await world.rpc(world.bob, "clipboard.policy.set", {"rigToHost": "allow"})
    assert (await world.http("GET", f"/rig/clipboard/{rig_id}", token="bob"))[0] == 200
    await world.rpc(world.admin, "clipboard.policy.set", {"rigToHost": "deny"})
    status, _h, out = await world.http("GET", f"/rig/clipboard/{rig_id}")
    assert status == 403 and json.loads(out)["error"]["data"]["ask"] is False
    rows = await world.api.call("rig.log", world.admin, {"rigId": rig_id})
    reads = [r for r in rows if r["verb"] == "clipboard_read"]
    assert reads and "héllo" not in json.dumps(rows)
    assert reads[0]["args"] == {"selection": "clipboard", "type": "text/plain", "bytes": 6, "stale": False}


async def test_paste_in_sets_text_on_both_selections_and_images_on_clipboard(world: World) -> None:
    rig_id, lanes = await world.open("computer")
    status, _h, out = await world.http("POST", f"/rig/clipboard/{rig_id}",
                                       headers={"Content-Type": "text/plain; charset=utf-8"},
                                       body=["pässword".encode()])
    assert status == 200 and json.loads(out) == {"type": "text/plain", "bytes": 9,
                                                 "selections": ["clipboard", "primary"]}
    assert lanes.selections["primary"].data == "pässword".encode()
    png = b"\x89PNG\r\n\x1a\n" + b"\x00" * 100
    status, _h, out = await world.http("POST", f"/rig/clipboard/{rig_id}",
                                       headers={"Content-Type": "image/png"}, body=[png])
    assert status == 200
    assert lanes.selections["clipboard"] == Clip("image/png", png)
    assert lanes.selections["primary"].media_type == "text/plain"
    status, _h, out = await world.http("POST", f"/rig/clipboard/{rig_id}",
                                       headers={"Content-Type": "image/png"}, body=[b"not a png"])
    assert status == 400 and json.loads(out)["error"]["data"]["field"] == "body"
    status, _h, out = await world.http("POST", f"/rig/clipboard/{rig_id}",
                                       headers={"Content-Type": "image/png"},
                                       body=[png] + [b"\x00" * (1 << 20)] * 17)
    assert status == 413
    status, _h, out = await world.http("POST", f"/rig/clipboard/{rig_id}", query="selection=xdnd",
                                       headers={"Content-Type": "text/plain"}, body=[b"x"])
    assert status == 400 and json.loads(out)["error"]["data"]["field"] == "selection"
    rows = await world.api.call("rig.log", world.admin, {"rigId": rig_id})
    assert "pässword" not in json.dumps(rows)


async def test_terminals_and_old_images_say_why_there_is_no_lane(world: World) -> None:
    rig_id, _lanes = await world.open("terminal")
    status, _h, out = await world.http("GET", f"/rig/clipboard/{rig_id}")
    assert status == 404 and "no clipboard" in json.loads(out)["error"]["message"]
    desk_id, lanes = await world.open("computer")
    lanes.features = frozenset()
    for method, lane in (("GET", "clipboard"), ("POST", "files")):
        status, _h, out = await world.http(method, f"/rig/{lane}/{desk_id}", headers=MP,
                                           body=[multipart([("a", b"1")])])
        assert status == 404 and "rebuild the image" in json.loads(out)["error"]["message"], out


async def test_a_drag_selection_held_since_the_press_is_stale(world: World) -> None:
    rig_id, lanes = await world.open("computer")
    await world.rpc(world.admin, "clipboard.policy.set", {"rigToHost": "allow"})
    lanes.selections["xdnd"] = Clip("text/uri-list", b"file:///home/rig/old.txt\r\n")
    live = world.rigs.live[rig_id]
    machine = world.computer.machines[-1]
    await world.rigs.note_press(live, machine)
    status, head, _out = await world.http("GET", f"/rig/clipboard/{rig_id}", query="selection=xdnd")
    assert status == 204 and "finished drag" in head["x-rigd-reason"]
    lanes.selections["xdnd"] = Clip("text/uri-list", b"file:///home/rig/new.txt\r\n")
    status, head, out = await world.http("GET", f"/rig/clipboard/{rig_id}", query="selection=xdnd")
    assert status == 200 and head["content-type"] == "text/uri-list" and out.endswith(b"new.txt\r\n")
    assert "clipboard" not in lanes.selections
    assert (await world.http("GET", f"/rig/clipboard/{rig_id}"))[0] == 204


async def test_an_oversize_file_is_refused_mid_stream_and_nothing_is_kept(
        world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    import rigd.server.lanes as server_lanes

    monkeypatch.setattr(server_lanes, "MAX_FILE_BYTES", 50_000)
    rig_id, lanes = await world.open("terminal")
    body = multipart([("ok.bin", b"o" * 1000), ("big.bin", b"b" * 60_000)])
    status, _h, out = await world.http("POST", f"/rig/files/{rig_id}", headers=MP, body=in_pieces(body))
    assert status == 413
    assert json.loads(out)["error"]["data"]["field"] == "files[1]"
    assert lanes.files == {}
    monkeypatch.setattr(server_lanes, "MAX_DROP_BYTES", 50_000)
    monkeypatch.setattr(server_lanes, "MAX_FILE_BYTES", 40_000)
    body = multipart([("a.bin", b"a" * 30_000), ("b.bin", b"b" * 30_000)])
    status, _h, out = await world.http("POST", f"/rig/files/{rig_id}", headers=MP, body=in_pieces(body))
    assert status == 413 and json.loads(out)["error"]["data"]["field"] == "files"
    assert lanes.files == {}
