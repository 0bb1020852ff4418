"""The agent's file ops (drops and reads), run on the host over pipes (``--stdio``).

Every test works on a real temporary directory; every byte the agent sends
goes through the host's sans-I/O parser, as in test_agent.py. The owner of a
drop is the user running the tests (a ``--stdio`` agent can only give files
to itself unless it runs as root).
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import pwd
import socket
import stat
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from rigd_agent import agent as agent_module
from rigd_agent import channel, files, ops_files

from rigd.protocols.guest import Ready, Stream
from tests.unit.test_agent import AgentHarness

ME = pwd.getpwuid(os.getuid()).pw_name
PART = 512 * 1024
CHUNK = 256 * 1024
_loads = json.loads  # the test's own, whatever a test does to the agent's


@pytest.fixture
def agent() -> Iterator[AgentHarness]:
    harness = AgentHarness.stdio()
    try:
        ready = harness.wait_for(lambda e: isinstance(e, Ready))
        assert isinstance(ready, Ready) and "files" in ready.features
        yield harness
    finally:
        harness.close()
    assert harness.garbage() == []


def ok(agent: AgentHarness, op: str, **fields: Any) -> dict[str, Any]:
    reply = agent.call(op, **fields)
    assert reply.ok, f"{op}: {reply.error}"
    return dict(reply.body)


def refused(agent: AgentHarness, op: str, **fields: Any) -> str:
    reply = agent.call(op, **fields)
    assert not reply.ok and reply.error is not None, reply
    return reply.error


def put(agent: AgentHarness, where: Path | str, name: str, data: bytes, *, close: bool = True) -> int:
    """One file of a drop: open, every part pipelined (up to 8 in flight), close."""
    handle = ok(agent, "file_put_open", dir=str(where), name=name, owner=ME)["handle"]
    rids: list[int] = []
    for offset in range(0, len(data), PART):
        if len(rids) == 8:
            assert agent.reply(rids.pop(0)).ok
        rids.append(agent.send("file_put_data", handle=handle, offset=offset, data=data[offset : offset + PART]))
    totals = [agent.reply(rid).body["bytes"] for rid in rids]
    assert not totals or totals[-1] == len(data)
    if close:
        body = ok(agent, "file_put_close", handle=handle, bytes=len(data), sha256=hashlib.sha256(data).hexdigest())
        assert body == {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    return handle


def temps(where: Path) -> list[str]:
    return sorted(n for n in os.listdir(where) if n.startswith(".rigd-drop-"))


# --------------------------------------------------------------------------
# drops


@pytest.mark.timeout(30)
def test_a_drop_of_several_files_never_overwrites(agent: AgentHarness, tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_bytes(b"was here first")
    (tmp_path / "b.bin").mkdir()  # a directory takes a name as well as a file
    os.symlink("/nonexistent", tmp_path / "c")  # and so does a dangling link
    files = [("a.txt", b"one"), ("a.txt", b"two"), ("b.bin", bytes(range(256))), ("c", b""), ("d", b"d")]
    handles = [put(agent, tmp_path, name, data) for name, data in files]
    assert len(temps(tmp_path)) == 5  # verified, but not visible under a name yet
    assert sorted(os.listdir(tmp_path)) == sorted(["a.txt", "b.bin", "c", *temps(tmp_path)])
    paths = ok(agent, "file_commit", handles=handles)["paths"]
    real = os.path.realpath(tmp_path)
    assert paths == [f"{real}/2-a.txt", f"{real}/3-a.txt", f"{real}/2-b.bin", f"{real}/2-c", f"{real}/d"]
    for path, (_, data) in zip(paths, files, strict=True):
        assert Path(path).read_bytes() == data
        st = os.stat(path)
        assert stat.S_IMODE(st.st_mode) == 0o644 and st.st_uid == os.getuid() and st.st_nlink == 1
    assert (tmp_path / "a.txt").read_bytes() == b"was here first"
    assert os.readlink(tmp_path / "c") == "/nonexistent"
    assert temps(tmp_path) == []
    # the handles are spent
    assert refused(agent, "file_commit", handles=handles[:1]).startswith(f"no such drop: {handles[0]}")


@pytest.mark.timeout(60)
def test_a_multi_part_file_arrives_intact(agent: AgentHarness, tmp_path: Path) -> None:
    data = os.urandom(5 * PART + 12345)  # six parts, pipelined
    handle = put(agent, tmp_path / "deep" / "er", "blob", data)
    (path,) = ok(agent, "file_commit", handles=[handle])["paths"]
    assert Path(path).read_bytes() == data
    # the missing directories were made, mode 0755, owned by the owner
    for d in (tmp_path / "deep", tmp_path / "deep" / "er"):
        st = os.stat(d)
        assert stat.S_IMODE(st.st_mode) == 0o755 and st.st_uid == os.getuid()


@pytest.mark.timeout(30)
def test_open_answers_the_resolved_directory_and_expands_home(agent: AgentHarness, tmp_path: Path) -> None:
    home = pwd.getpwnam(ME).pw_dir
    rel = os.path.relpath(tmp_path / "x", home)  # ~/../../tmp/…: the home, without writing into it
    body = ok(agent, "file_put_open", dir=f"~/{rel}/", name="n", owner=ME)
    assert body["dir"] == os.path.realpath(tmp_path / "x") and (tmp_path / "x").is_dir()
    assert ok(agent, "file_abort", handles=[body["handle"]]) == {"removed": 1}
    assert refused(agent, "file_put_open", dir="rel/dir", name="n", owner=ME) == (
        "bad request: dir must be absolute or start with ~/"
    )
    assert refused(agent, "file_put_open", dir=str(tmp_path), name="n", owner="no-such-user-xyz") == (
        "no such user: no-such-user-xyz"
    )
    (tmp_path / "file").write_bytes(b"")
    assert refused(agent, "file_put_open", dir=str(tmp_path / "file" / "sub"), name="n", owner=ME) == (
        f"not a directory: {tmp_path / 'file'}"
    )


@pytest.mark.timeout(30)
def test_the_temp_file_is_private_until_committed(agent: AgentHarness, tmp_path: Path) -> None:
    handle = put(agent, tmp_path, "secret", b"s3cret", close=False)
    (temp,) = temps(tmp_path)
    assert files.DROP_TEMP.match(temp)
    st = os.stat(tmp_path / temp)
    assert stat.S_IMODE(st.st_mode) == 0o600 and st.st_uid == os.getuid()
    ok(agent, "file_put_close", handle=handle, bytes=6, sha256=hashlib.sha256(b"s3cret").hexdigest())
    # writing to a closed drop is refused; so is closing it twice
    assert refused(agent, "file_put_data", handle=handle, offset=6, data=b"x") == f"drop {handle} is closed"
    assert refused(agent, "file_put_close", handle=handle, bytes=6, sha256="0" * 64) == (
        f"drop {handle} is already closed"
    )
    ok(agent, "file_commit", handles=[handle])


@pytest.mark.timeout(30)
@pytest.mark.parametrize("wrong", ["digest", "count"])
def test_a_wrong_digest_or_count_removes_the_temp(agent: AgentHarness, tmp_path: Path, wrong: str) -> None:
    data = os.urandom(70_000)
    handle = put(agent, tmp_path, "f", data, close=False)
    digest = hashlib.sha256(data).hexdigest()
    sent_digest = hashlib.sha256(b"other").hexdigest() if wrong == "digest" else digest
    sent_bytes = len(data) + 1 if wrong == "count" else len(data)
    error = refused(agent, "file_put_close", handle=handle, bytes=sent_bytes, sha256=sent_digest)
    assert error == (
        f"digest mismatch: the guest wrote {len(data)} bytes with sha256 {digest}; "
        f"the host sent {sent_bytes} bytes with sha256 {sent_digest}"
    )
    assert os.listdir(tmp_path) == []
    assert refused(agent, "file_commit", handles=[handle]) == f"no such drop: {handle}; nothing was committed"


@pytest.mark.timeout(30)
def test_offsets_must_follow(agent: AgentHarness, tmp_path: Path) -> None:
    handle = ok(agent, "file_put_open", dir=str(tmp_path), name="f", owner=ME)["handle"]
    assert ok(agent, "file_put_data", handle=handle, offset=0, data=b"hello") == {"bytes": 5}
    assert refused(agent, "file_put_data", handle=handle, offset=0, data=b"again") == "offset 0 does not follow 5"
    assert refused(agent, "file_put_data", handle=handle, offset=9, data=b"gap") == "offset 9 does not follow 5"
    assert ok(agent, "file_put_data", handle=handle, offset=5, data=b" world") == {"bytes": 11}
    assert ok(agent, "file_put_data", handle=handle, offset=11, data=b"") == {"bytes": 11}
    ok(agent, "file_put_close", handle=handle, bytes=11, sha256=hashlib.sha256(b"hello world").hexdigest())
    (path,) = ok(agent, "file_commit", handles=[handle])["paths"]
    assert Path(path).read_bytes() == b"hello world"


@pytest.mark.timeout(30)
def test_abort_leaves_nothing(agent: AgentHarness, tmp_path: Path) -> None:
    opened = put(agent, tmp_path, "open", b"x" * 1000, close=False)
    closed = put(agent, tmp_path, "closed", b"y" * 1000)
    assert len(temps(tmp_path)) == 2
    assert ok(agent, "file_abort", handles=[opened, 999, closed]) == {"removed": 2}  # unknown: ignored
    assert os.listdir(tmp_path) == []
    assert ok(agent, "file_abort", handles=[opened]) == {"removed": 0}
    assert refused(agent, "file_put_data", handle=opened, offset=1000, data=b"z") == f"no such drop: {opened}"


@pytest.mark.timeout(30)
def test_commit_is_all_or_nothing(agent: AgentHarness, tmp_path: Path) -> None:
    done = put(agent, tmp_path, "done", b"done")
    pending = put(agent, tmp_path, "pending", b"pend", close=False)
    error = refused(agent, "file_commit", handles=[done, pending])
    assert error == f"drop {pending} is not closed and verified; nothing was committed"
    assert len(temps(tmp_path)) == 2 and sorted(os.listdir(tmp_path)) == temps(tmp_path)
    # a link failing midway takes back the names already linked in this commit
    long_name = "n" * 255
    first = put(agent, tmp_path, "first", b"1")
    (tmp_path / long_name).write_bytes(b"taken")  # "2-nnn…" is over NAME_MAX: that link fails
    clash = put(agent, tmp_path, long_name, b"2")
    error = refused(agent, "file_commit", handles=[first, clash])
    assert error.startswith("commit failed, nothing was committed: file name too long")
    assert not (tmp_path / "first").exists() and (tmp_path / long_name).read_bytes() == b"taken"
    # the drops are still pending: committing the good ones works
    ok(agent, "file_put_close", handle=pending, bytes=4, sha256=hashlib.sha256(b"pend").hexdigest())
    paths = ok(agent, "file_commit", handles=[done, pending, first])["paths"]
    assert [Path(p).name for p in paths] == ["done", "pending", "first"]
    assert ok(agent, "file_abort", handles=[clash]) == {"removed": 1}
    assert temps(tmp_path) == []
    assert refused(agent, "file_commit", handles=[1, 1]) == "bad request: handles must not repeat"
    assert refused(agent, "file_commit", handles="1") == "bad request: handles must be a list of integers"
    assert ok(agent, "file_commit", handles=[]) == {"paths": []}


@pytest.mark.timeout(30)
@pytest.mark.parametrize(
    ("name", "why"),
    [
        ("a/b", "must not contain /"),
        ("a\0b", "must not contain NUL"),
        ("a\nb", "must not contain control characters"),
        ("tab\there", "must not contain control characters"),
        ("del\x7f", "must not contain control characters"),
        (".", "must not be '.'"),
        ("..", "must not be '..'"),
        ("x" * 256, "is 256 bytes of UTF-8, over 255"),
        ("é" * 128, "is 256 bytes of UTF-8, over 255"),
        ("", "must be a non-empty string"),
        (5, "must be a non-empty string"),
        (".rigd-drop-0123456789abcdef.part", "is reserved for the agent's temporary files"),
    ],
)
def test_bad_names_are_refused(agent: AgentHarness, tmp_path: Path, name: Any, why: str) -> None:
    assert refused(agent, "file_put_open", dir=str(tmp_path), name=name, owner=ME) == f"bad request: name {why}"
    assert os.listdir(tmp_path) == []


@pytest.mark.timeout(30)
def test_odd_but_valid_names(agent: AgentHarness, tmp_path: Path) -> None:
    names = ["x" * 255, "é" * 127, "...", "-rf", " space ", "世界.txt", ".hidden"]
    handles = [put(agent, tmp_path, name, name.encode()) for name in names]
    paths = ok(agent, "file_commit", handles=handles)["paths"]
    assert [Path(p).name for p in paths] == names
    assert all(Path(p).read_bytes() == n.encode() for p, n in zip(paths, names, strict=True))


@pytest.mark.timeout(30)
@pytest.mark.parametrize(
    ("fields", "error"),
    [
        ({"offset": 0, "data": "!!!!"}, "data is not valid base64"),
        ({"offset": 0, "data": "YQ"}, "data is not valid base64"),
        ({"offset": 0}, "data is required and must be a base64 string"),
        ({"offset": -1, "data": ""}, "offset must be at least 0"),
        ({"offset": "0", "data": ""}, "offset must be an integer"),
        ({"data": ""}, "offset is required"),
        ({"offset": 0, "data": b"x" * (PART + 1)}, f"data is over {PART} bytes"),
    ],
)
def test_put_data_fields(agent: AgentHarness, tmp_path: Path, fields: dict[str, Any], error: str) -> None:
    handle = ok(agent, "file_put_open", dir=str(tmp_path), name="f", owner=ME)["handle"]
    assert refused(agent, "file_put_data", handle=handle, **fields) == f"bad request: {error}"
    assert ok(agent, "file_put_data", handle=handle, offset=0, data=b"x" * PART) == {"bytes": PART}


@pytest.mark.timeout(30)
def test_close_fields(agent: AgentHarness, tmp_path: Path) -> None:
    handle = ok(agent, "file_put_open", dir=str(tmp_path), name="f", owner=ME)["handle"]
    for sha in ("A" * 64, "0" * 63, 5, None):
        assert refused(agent, "file_put_close", handle=handle, bytes=0, sha256=sha) == (
            "bad request: sha256 must be 64 lower-case hex digits"
        )
    assert refused(agent, "file_put_close", handle=12345, bytes=0, sha256="0" * 64) == "no such drop: 12345"


@pytest.mark.timeout(60)
def test_at_most_64_open_drops(agent: AgentHarness, tmp_path: Path) -> None:
    handles = [ok(agent, "file_put_open", dir=str(tmp_path), name=f"f{i}", owner=ME)["handle"] for i in range(64)]
    assert len(set(handles)) == 64
    assert refused(agent, "file_put_open", dir=str(tmp_path), name="one-more", owner=ME) == "too many open drops"
    # a closed (verified) drop no longer holds a file open
    ok(agent, "file_put_close", handle=handles[0], bytes=0, sha256=hashlib.sha256(b"").hexdigest())
    more = ok(agent, "file_put_open", dir=str(tmp_path), name="one-more", owner=ME)["handle"]
    assert ok(agent, "file_abort", handles=[*handles, more]) == {"removed": 65}
    assert os.listdir(tmp_path) == []


@pytest.mark.timeout(30)
def test_stale_temps_are_swept_on_open(agent: AgentHarness, tmp_path: Path) -> None:
    stale = tmp_path / ".rigd-drop-00000000000000aa.part"
    fresh = tmp_path / ".rigd-drop-00000000000000bb.part"
    lookalike = tmp_path / ".rigd-drop-xyz.part"
    for f in (stale, fresh, lookalike):
        f.write_bytes(b"left over")
    old = time.time() - 3700
    os.utime(stale, (old, old))
    os.utime(lookalike, (old, old))
    mine = put(agent, tmp_path, "mine", b"m", close=False)  # owned by a handle: never swept
    (mine_temp,) = (n for n in temps(tmp_path) if n not in (stale.name, fresh.name, lookalike.name))
    os.utime(tmp_path / mine_temp, (old, old))
    other = ok(agent, "file_put_open", dir=str(tmp_path), name="other", owner=ME)["handle"]
    assert not stale.exists()
    assert fresh.exists() and lookalike.exists() and (tmp_path / mine_temp).exists()
    ok(agent, "file_abort", handles=[mine, other])


@pytest.mark.timeout(30)
def test_the_size_limit_of_a_drop(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # 256 MiB is too much to push through a unit test: the same code, in
    # process, with the limit at 1000 bytes.
    monkeypatch.setattr(ops_files, "DROP_FILE_MAX", 1000)
    agent, lines = in_process()
    agent.handle_line(request(1, "file_put_open", dir=str(tmp_path), name="big", owner=ME))
    handle = lines.pop()["handle"]
    agent.handle_line(request(2, "file_put_data", handle=handle, offset=0, data=b"x" * 1000))
    assert lines.pop() == {"id": 2, "ok": True, "bytes": 1000}
    agent.handle_line(request(3, "file_put_data", handle=handle, offset=1000, data=b"x"))
    assert lines.pop() == {"id": 3, "ok": False, "error": f"drop {handle} is over the 1000-byte limit: removed it"}
    assert os.listdir(tmp_path) == []
    agent.handle_line(request(4, "file_put_data", handle=handle, offset=1000, data=b"x"))
    assert lines.pop() == {"id": 4, "ok": False, "error": f"no such drop: {handle}"}


def request(rid: int, op: str, **fields: Any) -> bytes:
    encoded = {k: base64.b64encode(v).decode() if isinstance(v, bytes) else v for k, v in fields.items()}
    return json.dumps({"id": rid, "op": op, **encoded}).encode()


def in_process() -> tuple[Any, list[dict[str, Any]]]:
    """An Agent whose channel is a list of the lines it sent (quick ops only: they run inline)."""
    lines: list[dict[str, Any]] = []

    class Lines(channel.Channel):
        def send_parts(self, parts: list[bytes]) -> bool:
            lines.append(_loads(b"".join(parts)))
            return True

    chan = Lines(-1)
    return agent_module.Agent(chan, may_set_clock=False, may_power_off=False), lines


# --------------------------------------------------------------------------
# reads


def start_read(agent: AgentHarness, path: Path | str, *, window: int, max_bytes: int = 1 << 30) -> int:
    return agent.send("file_read", path=str(path), maxBytes=max_bytes, window=window)


def next_stream(agent: AgentHarness, rid: int, timeout: float = 10.0) -> Stream:
    event = agent.wait_for(lambda e: isinstance(e, Stream) and e.id == rid, timeout)
    assert isinstance(event, Stream)
    return event


def quiet(agent: AgentHarness, rid: int, seconds: float = 0.5) -> bool:
    """Nothing more came for ``rid`` in ``seconds``."""
    time.sleep(seconds)
    with agent.lock:
        return not any(getattr(e, "id", None) == rid for e in agent.events)


@pytest.mark.timeout(60)
def test_file_read_streams_under_the_window(agent: AgentHarness, tmp_path: Path) -> None:
    data = os.urandom(4 * CHUNK + 1000)
    f = tmp_path / "payload.bin"
    f.write_bytes(data)
    f.chmod(0o640)
    window = 2 * CHUNK
    rid = start_read(agent, f, window=window)
    meta = next_stream(agent, rid)
    assert meta.name == "meta"
    assert meta.body == {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest(),
                         "name": "payload.bin", "mode": 0o640}  # fmt: skip
    got = bytearray()
    for _ in range(2):  # a window's worth
        event = next_stream(agent, rid)
        assert event.name == "data" and event.body == {"offset": len(got)} and len(event.data) == CHUNK
        got += event.data
    # the agent stops at the window until the host acknowledges
    assert quiet(agent, rid)
    assert ok(agent, "file_ack", read=rid, offset=CHUNK) == {"known": True}
    event = next_stream(agent, rid)
    assert event.body == {"offset": len(got)} and len(event.data) == CHUNK
    got += event.data
    assert quiet(agent, rid)
    # an ack beyond what was sent is credited only up to what was sent
    assert ok(agent, "file_ack", read=rid, offset=10 * CHUNK) == {"known": True}
    while len(got) < len(data):
        event = next_stream(agent, rid)
        assert event.body == {"offset": len(got)}
        got += event.data
    reply = agent.reply(rid)
    assert reply.ok and reply.body == {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    assert bytes(got) == data
    assert ok(agent, "file_ack", read=rid, offset=len(data)) == {"known": False}  # finished


@pytest.mark.timeout(30)
def test_a_small_window_makes_small_chunks(agent: AgentHarness, tmp_path: Path) -> None:
    f = tmp_path / "f"
    f.write_bytes(b"abcdefghij")
    rid = start_read(agent, f, window=4)
    assert next_stream(agent, rid).name == "meta"
    assert next_stream(agent, rid).data == b"abcd"
    assert quiet(agent, rid, 0.3)
    ok(agent, "file_ack", read=rid, offset=4)
    assert next_stream(agent, rid).data == b"efgh"
    ok(agent, "file_ack", read=rid, offset=8)
    assert next_stream(agent, rid).data == b"ij"
    assert agent.reply(rid).body["bytes"] == 10


@pytest.mark.timeout(30)
def test_an_empty_file(agent: AgentHarness, tmp_path: Path) -> None:
    f = tmp_path / "empty"
    f.write_bytes(b"")
    rid = start_read(agent, f, window=1, max_bytes=0)
    assert next_stream(agent, rid).body["bytes"] == 0
    reply = agent.reply(rid)
    assert reply.body == {"bytes": 0, "sha256": hashlib.sha256(b"").hexdigest()}
    assert agent.streams(rid) == []


@pytest.mark.timeout(30)
def test_a_file_that_changes_between_the_passes(agent: AgentHarness, tmp_path: Path) -> None:
    data = os.urandom(CHUNK)
    f = tmp_path / "log"
    f.write_bytes(data)
    rid = start_read(agent, f, window=1000)
    meta = next_stream(agent, rid)
    assert next_stream(agent, rid).data == data[:1000]
    os.truncate(f, 2500)  # shrinks while the agent waits for credit
    ok(agent, "file_ack", read=rid, offset=1000)
    assert next_stream(agent, rid).body == {"offset": 1000}
    ok(agent, "file_ack", read=rid, offset=2000)
    assert next_stream(agent, rid).data == data[2000:2500]
    reply = agent.reply(rid)
    # the reply tells what was sent; the host sees it differs from meta and fails the transfer
    assert reply.ok and reply.body["bytes"] == 2500 and meta.body["bytes"] == CHUNK
    assert reply.body["sha256"] == hashlib.sha256(data[:2500]).hexdigest() != meta.body["sha256"]


@pytest.mark.timeout(30)
def test_file_read_refusals(agent: AgentHarness, tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    sock_path = tmp_path / "sock"
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(sock_path))
    big = tmp_path / "big"
    big.write_bytes(b"x" * 1001)
    try:
        cases = [
            (tmp_path, "not a regular file: directory"),
            (fifo, "not a regular file: fifo"),  # and the open did not wait for a writer
            ("/dev/null", "not a regular file: character device"),
            (sock_path, "not a regular file: socket"),
            (big, "file is 1001 bytes, over the limit of 1000"),
            (tmp_path / "missing", f"no such file or directory: {tmp_path / 'missing'}"),
            ("relative/path", "bad request: path must be an absolute path"),
        ]
        for path, error in cases:
            rid = start_read(agent, path, window=CHUNK, max_bytes=1000)
            reply = agent.reply(rid)
            assert (reply.ok, reply.error) == (False, error), path
            assert agent.streams(rid) == []
    finally:
        sock.close()
    for fields, error in [
        ({"path": str(big), "window": 1}, "maxBytes is required"),
        ({"path": str(big), "maxBytes": 10}, "window is required"),
        ({"path": str(big), "maxBytes": 10, "window": 0}, "window must be between 1 and"),
        ({"path": str(big), "maxBytes": -1, "window": 1}, "maxBytes must be between 0 and"),
    ]:
        assert refused(agent, "file_read", **fields).startswith(f"bad request: {error}")


@pytest.mark.timeout(30)
def test_file_read_cancel(agent: AgentHarness, tmp_path: Path) -> None:
    f = tmp_path / "f"
    f.write_bytes(os.urandom(4 * CHUNK))
    rid = start_read(agent, f, window=CHUNK)
    assert next_stream(agent, rid).name == "meta"
    assert next_stream(agent, rid).name == "data"
    assert ok(agent, "file_read_cancel", read=rid) == {}
    reply = agent.reply(rid)
    assert (reply.ok, reply.error) == (False, "cancelled")
    assert agent.streams(rid) == []
    assert ok(agent, "file_read_cancel", read=rid) == {}  # unknown by now: still fine
    assert ok(agent, "file_ack", read=424242, offset=0) == {"known": False}


@pytest.mark.timeout(30)
def test_a_cancel_right_behind_the_read(agent: AgentHarness, tmp_path: Path) -> None:
    f = tmp_path / "f"
    f.write_bytes(os.urandom(4 * CHUNK))
    # both lines in one write: the cancel is read before the read's thread may run
    rid, line = agent.proto.send_request("file_read", path=str(f), maxBytes=1 << 30, window=CHUNK)
    cid, cancel = agent.proto.send_request("file_read_cancel", read=rid)
    agent.send_raw(line + cancel)
    assert agent.reply(cid).ok
    reply = agent.reply(rid)
    assert (reply.ok, reply.error) == (False, "cancelled")
    # a meta may have come first (the thread can win the race), never more than one window
    events = agent.streams(rid)
    assert [e.name for e in events] in ([], ["meta"], ["meta", "data"])



@pytest.mark.timeout(30)
def test_put_data_spelled_any_way_is_the_same(agent: AgentHarness, tmp_path: Path) -> None:
    # The agent takes the host's own spelling apart without json.loads; any
    # other spelling of the same request goes through JSON with the same effect.
    handle = ok(agent, "file_put_open", dir=str(tmp_path), name="f", owner=ME)["handle"]
    spellings = [
        lambda rid, off, d: json.dumps({"id": rid, "op": "file_put_data", "handle": handle, "offset": off, "data": d}),
        lambda rid, off, d: json.dumps({"data": d, "offset": off, "handle": handle, "op": "file_put_data", "id": rid}),
        lambda rid, off, d: f'{{"id":{rid},"op":"file_put_data","handle":{handle},"offset":{off},"data":"{d}","x":1}}',
        lambda rid, off, d: f'{{"id":{rid},"op":"file_put_data","handle":{handle},"offset":{off},"data":"{d}","x":"}}"}}',
        lambda rid, off, d: f'{{"id":{rid},"op":"file_put_data","handle":{handle},"offset":{off},"data":"{d}"}}',
    ]
    written = b""
    for i, spell in enumerate(spellings):
        part = bytes([i]) * (1000 + i)
        rid, _ = agent.proto.send_request("file_put_data")  # an id the parser expects an answer to
        agent.send_raw(spell(rid, len(written), base64.b64encode(part).decode()).encode() + b"\n")
        written += part
        assert agent.reply(rid).body == {"bytes": len(written)}
    # the same refusals both ways
    for spell in spellings[::4]:
        rid, _ = agent.proto.send_request("file_put_data")
        agent.send_raw(spell(rid, 0, "QQ==").encode() + b"\n")
        reply = agent.reply(rid)
        assert (reply.ok, reply.error) == (False, f"offset 0 does not follow {len(written)}")
    ok(agent, "file_put_close", handle=handle, bytes=len(written), sha256=hashlib.sha256(written).hexdigest())
    (path,) = ok(agent, "file_commit", handles=[handle])["paths"]
    assert Path(path).read_bytes() == written


@pytest.mark.timeout(30)
def test_paths_must_be_encodable(agent: AgentHarness, tmp_path: Path) -> None:
    assert refused(agent, "file_put_open", dir=f"{tmp_path}/\ud800", name="n", owner=ME) == (
        "bad request: dir is not valid Unicode (lone surrogate)"
    )
    assert refused(agent, "file_put_open", dir=str(tmp_path), name="\ud800", owner=ME) == (
        "bad request: name is not valid Unicode (lone surrogate)"
    )
    assert refused(agent, "file_read", path="/tmp/\ud800", maxBytes=1, window=1) == (
        "bad request: path is not valid Unicode (lone surrogate)"
    )
    assert os.listdir(tmp_path) == []


def test_the_hosts_spelling_of_put_data_skips_json(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from rigd.protocols.guest import GuestProtocol

    agent, lines = in_process()
    agent.handle_line(request(1, "file_put_open", dir=str(tmp_path), name="f", owner=ME))
    handle = lines.pop()["handle"]
    parsed: list[bytes] = []
    real_loads = json.loads
    monkeypatch.setattr(json, "loads", lambda s, **kw: parsed.append(s) or real_loads(s, **kw))
    proto = GuestProtocol()
    proto._next_id = 2
    _, line = proto.send_request("file_put_data", handle=handle, offset=0, data=b"x" * PART)
    agent.handle_line(line.rstrip(b"\n"))
    assert lines.pop() == {"id": 2, "ok": True, "bytes": PART} and parsed == []
    agent.handle_line(request(3, "file_put_data", handle=handle, offset=PART, data=b"y"))  # spaces: JSON
    assert lines.pop() == {"id": 3, "ok": True, "bytes": PART + 1} and len(parsed) == 1
