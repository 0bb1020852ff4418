"""The machine's half of the clipboard and file lanes (RIGS.md §10), over the agent.

The HTTP side (``rigd.server.lanes``) streams bytes in and out; this module
moves them through the guest agent's lane ops (docs/guest-protocol.md,
"Lanes"): a drop is a set of temporary files in the guest, each checked by
sha256 at the agent, made visible under their names only when every file of
the drop arrived (``file_commit``), removed otherwise (``file_abort``). A
download is credit-based: the agent never sends more than ``READ_WINDOW``
bytes past what the host consumed, so a slow HTTP client slows the guest, not
the server's memory.

The guest is hostile: every size, offset and digest it reports is checked
against what the host itself counted.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import re
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, TypeGuard, runtime_checkable

import trio

from rigd.errors import BackendError, FieldError, GuestError, GuestRefused

if TYPE_CHECKING:
    from rigd.backends.guest_client import GuestConnection, PendingCall
    from rigd.protocols.guest import Stream

MIB = 1024 * 1024
#: Per file, per drop, files per drop (RIGS.md §10).
MAX_FILE_BYTES = 256 * MIB
MAX_DROP_BYTES = 512 * MIB
MAX_DROP_FILES = 64
#: A clipboard image, and a clipboard text (the agent's own cap).
MAX_CLIP_IMAGE = 16 * MIB
MAX_CLIP_TEXT = 1 * MIB
#: Raw bytes per ``file_put_data`` line (base64 keeps the line under 1 MiB).
PUT_CHUNK = 512 * 1024
#: ``file_put_data`` requests in flight per file.
PUT_PIPELINE = 8
#: Bytes the agent may send past what the host consumed (``file_read``).
READ_WINDOW = 4 * MIB
#: Characters per ``clipboard_write`` text part: 12 escaped bytes each at worst.
CLIP_PART_CHARS = 60_000

CLIP_TYPES = ("text/plain", "text/uri-list", "image/png", "image/jpeg")
SELECTIONS = ("clipboard", "primary", "xdnd")
_HEX64 = re.compile(r"[0-9a-f]{64}")


@dataclass(frozen=True, slots=True)
class DropTarget:
    """Where a surface's drops land and what the guest is told about them."""

    #: Absolute, or ``~/`` for the owner's home (resolved in the guest).
    dir: str
    #: The guest user the files belong to.
    owner: str
    #: "clipboard" (a desktop gets the files' URIs on CLIPBOARD), "drop-event" (the page
    #: gets a real drop of the files at the drop point: Chromium) or "none".
    told: str


#: Tells the guest's page about committed drop files: (guest paths, drop point or None).
DropEvent = Callable[[list[str], "tuple[int, int] | None"], Awaitable[None]]


@runtime_checkable
class DropReceiver(Protocol):
    """A driver whose surface takes dropped files as an event (a browser page)."""

    async def drop_event(self, paths: list[str], point: tuple[int, int] | None) -> None: ...


@dataclass(frozen=True, slots=True)
class SavedFile:
    name: str
    path: str
    bytes: int
    sha256: str

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "path": self.path, "bytes": self.bytes, "sha256": self.sha256}


@dataclass(frozen=True, slots=True)
class Clip:
    """What a selection holds: its media type and its bytes (UTF-8 for text)."""

    media_type: str
    data: bytes
    #: The owner's offered targets (informational; empty when unknown).
    targets: tuple[str, ...] = ()


class Sink(Protocol):
    """One file of a drop on its way in."""

    name: str

    async def write(self, data: bytes) -> None: ...

    async def close(self) -> tuple[int, str]:
        """(bytes, sha256) once the guest checked them."""
        ...


class DropSession(Protocol):
    target: DropTarget

    async def add(self, name: str) -> Sink: ...

    async def commit(self) -> list[SavedFile]:
        """Make every file visible under its (collision-free) name."""
        ...


class Source(Protocol):
    """One guest file on its way out."""

    name: str
    size: int
    sha256: str

    def chunks(self) -> AsyncIterator[bytes]: ...


class Lanes(Protocol):
    """A machine's clipboard and file lanes."""

    target: DropTarget
    #: How a ``told == "drop-event"`` target is told (None: it cannot be).
    drop_event: DropEvent | None

    def missing(self, lane: str) -> str | None:
        """Why the machine cannot serve ``lane`` ("files" or "clipboard"); None if it can."""
        ...

    def drop(self) -> AbstractAsyncContextManager[DropSession]:
        """A drop: leaving without ``commit`` (or with an error) leaves nothing in the guest."""
        ...

    def read_file(self, path: str, max_bytes: int) -> AbstractAsyncContextManager[Source]: ...

    async def clipboard_get(self, selection: str) -> Clip | None: ...

    async def clipboard_set(self, selection: str, clip: Clip) -> None: ...


def check_name(name: str, field: str) -> str:
    """A file name a drop may use: the field error names the part otherwise."""
    encoded = name.encode("utf-8", "surrogatepass")
    if not name:
        raise FieldError(field, "a file needs a name")
    if name in (".", ".."):
        raise FieldError(field, f"{name!r} is not a file name")
    if "/" in name or "\x00" in name:
        raise FieldError(field, "a file name cannot contain '/' or NUL")
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in name):
        raise FieldError(field, "a file name cannot contain control characters")
    if len(encoded) > 255:
        raise FieldError(field, f"a file name is at most 255 bytes (this one is {len(encoded)})")
    try:
        encoded.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise FieldError(field, "a file name must be valid UTF-8") from exc
    return name


def _int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _hex(value: object) -> TypeGuard[str]:
    return isinstance(value, str) and _HEX64.fullmatch(value) is not None


class FileSink:
    """One file of a drop: bytes in order, then :meth:`close` with the host's digest."""

    def __init__(self, guest: GuestConnection, handle: int, name: str, timeout: float) -> None:
        self._guest = guest
        self.handle = handle
        self.name = name
        self._timeout = timeout
        self._sha = hashlib.sha256()
        self.bytes = 0
        self._inflight: deque[PendingCall] = deque()
        self.closed = False

    @property
    def sha256(self) -> str:
        return self._sha.hexdigest()

    async def write(self, data: bytes) -> None:
        if self.bytes + len(data) > MAX_FILE_BYTES:
            raise FieldError("files", f"{self.name!r} is over {MAX_FILE_BYTES // MIB} MB")
        view = memoryview(data)
        for start in range(0, len(view), PUT_CHUNK):
            piece = view[start:start + PUT_CHUNK]
            self._sha.update(piece)
            call = await self._guest.send("file_put_data", timeout=self._timeout, handle=self.handle,
                                          offset=self.bytes, data=base64.b64encode(piece).decode())
            self.bytes += len(piece)
            self._inflight.append(call)
            if len(self._inflight) >= PUT_PIPELINE:
                await self._settle_one()

    async def _settle_one(self) -> None:
        call = self._inflight.popleft()
        body = await call.result(self._timeout)
        got = body.get("bytes")
        if not _int(got) or got < 0 or got > self.bytes:
            raise GuestError(f"the guest reported {got!r} bytes written of {self.name!r}")

    async def close(self) -> tuple[int, str]:
        """Wait for every chunk, then have the agent check size and digest."""
        while self._inflight:
            await self._settle_one()
        body = await self._guest.request("file_put_close", timeout=self._timeout, handle=self.handle,
                                         bytes=self.bytes, sha256=self.sha256)
        self.closed = True
        if body.get("bytes") != self.bytes or body.get("sha256") != self.sha256:
            raise GuestError(f"the guest's digest of {self.name!r} does not match the host's")
        return self.bytes, self.sha256

    def abandon(self) -> None:
        for call in self._inflight:
            call.forget()
        self._inflight.clear()


class Drop:
    """Files on their way into the guest; none is visible until :meth:`commit`."""

    def __init__(self, guest: GuestConnection, target: DropTarget, timeout: float) -> None:
        self._guest = guest
        self.target = target
        self._timeout = timeout
        self.files: list[FileSink] = []
        self.dir: str | None = None
        self.committed = False

    async def add(self, name: str) -> FileSink:
        if len(self.files) >= MAX_DROP_FILES:
            raise FieldError("files", f"a drop holds at most {MAX_DROP_FILES} files")
        body = await self._guest.request("file_put_open", timeout=self._timeout, dir=self.target.dir,
                                         name=name, owner=self.target.owner)
        handle, where = body.get("handle"), body.get("dir")
        if not _int(handle) or not isinstance(where, str) or not where.startswith("/"):
            raise GuestError("the guest sent a malformed file_put_open reply")
        self.dir = where
        sink = FileSink(self._guest, handle, name, self._timeout)
        self.files.append(sink)
        return sink

    async def commit(self) -> list[SavedFile]:
        body = await self._guest.request("file_commit", timeout=self._timeout,
                                         handles=[f.handle for f in self.files])
        paths = body.get("paths")
        if (not isinstance(paths, list) or len(paths) != len(self.files)
                or not all(isinstance(p, str) and p.startswith("/") for p in paths)):
            raise GuestError("the guest sent a malformed file_commit reply")
        self.committed = True
        return [SavedFile(f.name, p, f.bytes, f.sha256) for f, p in zip(self.files, paths, strict=True)]

    async def abort(self) -> None:
        for sink in self.files:
            sink.abandon()
        if self.files and not self.committed:
            await self._guest.request("file_abort", timeout=self._timeout,
                                      handles=[f.handle for f in self.files])


class FileOut:
    """One guest file on its way out: its size and digest first, then its bytes."""

    def __init__(self, name: str, size: int, sha256: str, mode: int,
                 receive: trio.MemoryReceiveChannel[bytes],
                 ack: Callable[[int], Awaitable[None]], finish: Callable[[], Awaitable[None]]) -> None:
        self.name = name
        self.size = size
        self.sha256 = sha256
        self.mode = mode
        self._receive = receive
        self._ack = ack
        self._finish = finish

    async def chunks(self) -> AsyncIterator[bytes]:
        """The file's bytes; raises GuestError at the end if they are not what was announced."""
        consumed = acked = 0
        async with self._receive:
            async for chunk in self._receive:
                consumed += len(chunk)
                if consumed - acked >= READ_WINDOW // 2:
                    acked = consumed
                    await self._ack(consumed)
                yield chunk
        await self._finish()


class GuestLanes:
    """The lanes of a QEMU machine, over its agent channel."""

    def __init__(self, channel: Callable[[], GuestConnection], features: Callable[[], frozenset[str]],
                 target: DropTarget, *, grace: float, screen: bool,
                 no_clipboard: str = "a terminal rig has no clipboard (it has no X session); "
                                     "use the file lane",
                 drop_event: DropEvent | None = None) -> None:
        self._channel = channel
        self._features = features
        self.target = target
        self._timeout = grace + 30
        self._screen = screen
        self._no_clipboard = no_clipboard
        self.drop_event = drop_event

    def missing(self, lane: str) -> str | None:
        """Why this machine cannot serve ``lane`` ("files", "clipboard"), or None."""
        feats = self._features()
        if lane == "files":
            if "files" not in feats:
                return ("this rig's image predates the file lane (its guest agent has no 'files'); "
                        "rebuild the image")
            return None
        if not self._screen:
            return self._no_clipboard
        if not {"clipboard_read", "clipboard_write", "clipboard_image", "clipboard_files"} <= feats:
            return ("this rig's image predates the clipboard lane (guest protocol 2 with image "
                    "clipboard support); rebuild the image")
        return None

    def _require(self, lane: str) -> GuestConnection:
        reason = self.missing(lane)
        if reason is not None:
            raise BackendError(reason)
        return self._channel()

    @asynccontextmanager
    async def drop(self) -> AsyncIterator[Drop]:
        drop = Drop(self._require("files"), self.target, self._timeout)
        try:
            yield drop
        except BaseException:
            with trio.CancelScope(shield=True), trio.move_on_after(self._timeout), \
                    contextlib.suppress(GuestError, BackendError):
                await drop.abort()
            raise
        if not drop.committed:
            with trio.CancelScope(shield=True):
                await drop.abort()

    @asynccontextmanager
    async def read_file(self, path: str, max_bytes: int) -> AsyncIterator[FileOut]:
        guest = self._require("files")
        send, receive = trio.open_memory_channel[bytes](READ_WINDOW // 4096 + 8)
        meta: list[dict[str, Any]] = []
        got_meta = trio.Event()
        sha = hashlib.sha256()
        counted = [0]
        problem: list[str] = []

        def fail(text: str) -> None:
            problem.append(text)
            send.close()
            got_meta.set()

        def on_stream(event: Stream) -> None:
            if problem:
                return
            if event.name == "meta":
                size, digest, name = (event.body.get("bytes"), event.body.get("sha256"),
                                      event.body.get("name"))
                if meta or not (_int(size) and 0 <= size <= max_bytes and _hex(digest)
                                and isinstance(name, str)):
                    fail("the guest sent a malformed file_read meta event")
                    return
                meta.append(dict(event.body))
                got_meta.set()
                return
            if event.name != "data" or not meta:
                fail("the guest sent file data before its size and digest")
                return
            counted[0] += len(event.data)
            sha.update(event.data)
            if counted[0] > meta[0]["bytes"]:
                fail("the guest sent more bytes than the file has")
                return
            try:
                send.send_nowait(event.data)
            except trio.WouldBlock:
                fail("the guest sent past its flow-control window")
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                # The reader has gone (its client left): what is still in flight before the
                # guest sees file_read_cancel is dropped. Never an error of the rig's.
                problem.append("the reader went away")

        def on_reply() -> None:
            send.close()
            got_meta.set()

        # A large file under TCG: its transfer time on top of the grace.
        budget = self._timeout + max_bytes / (256 * 1024)
        pending = await guest.send("file_read", timeout=self._timeout, on_stream=on_stream,
                                   on_reply=on_reply, path=path, maxBytes=max_bytes, window=READ_WINDOW)
        finished = False
        try:
            with trio.move_on_after(self._timeout):
                await got_meta.wait()
            if not meta:
                try:
                    await pending.result(0)
                except GuestRefused as exc:
                    raise FieldError("p", exc.reason) from exc
                raise GuestError(problem[0] if problem else "the guest sent no file")
            info = meta[0]

            async def ack(offset: int) -> None:
                call = await guest.send("file_ack", timeout=self._timeout, read=pending.id,
                                        offset=offset)
                call.forget()

            async def finish() -> None:
                nonlocal finished
                if problem:
                    raise GuestError(problem[0])
                body = await pending.result(budget)
                finished = True
                size, digest = info["bytes"], info["sha256"]
                if (counted[0] != size or body.get("bytes") != size
                        or sha.hexdigest() != digest or body.get("sha256") != digest):
                    raise GuestError("the file changed while it was read (its size or sha256 "
                                     "differs from what the guest announced)")

            mode = info.get("mode")
            yield FileOut(str(info["name"])[:255], info["bytes"], info["sha256"],
                          mode if _int(mode) else 0, receive, ack, finish)
        finally:
            if not finished and not pending.answered:
                with trio.CancelScope(shield=True), trio.move_on_after(5), \
                        contextlib.suppress(GuestError, BackendError):
                    await guest.request("file_read_cancel", timeout=5, read=pending.id)
            pending.forget()

    async def clipboard_get(self, selection: str) -> Clip | None:
        guest = self._require("clipboard")
        parts: list[bytes] = []

        def on_stream(event: Stream) -> None:
            if event.name == "data":
                parts.append(event.data)

        body = await guest.request("clipboard_read", timeout=self._timeout, on_stream=on_stream,
                                   selection=selection, accept=["text", "image", "uris"])
        if body.get("owner") is not True:
            return None
        media = body.get("mediaType", "text/plain")
        if media not in CLIP_TYPES:
            raise GuestError(f"the guest sent a clipboard of unknown type {str(media)[:40]!r}")
        text, data = body.get("text"), body.get("data")
        if isinstance(text, str):
            raw = text.encode("utf-8", "replace")
        elif isinstance(data, str):
            raw = base64.b64decode(data)
        else:
            raw = b"".join(parts)
        if len(raw) > MAX_CLIP_IMAGE:
            raise GuestError("the guest sent a clipboard over 16 MB")
        targets = body.get("targets")
        names = tuple(t for t in targets if isinstance(t, str))[:64] if isinstance(targets, list) else ()
        if not raw:
            return None
        return Clip(str(media), raw, names)

    async def clipboard_set(self, selection: str, clip: Clip) -> None:
        await write_selection(self._require("clipboard"), selection, clip, self._timeout)


async def write_selection(guest: GuestConnection, selection: str, clip: Clip, timeout: float) -> int:
    """Make ``clip`` the guest's ``selection``, in parts that fit one line each."""
    fields: list[dict[str, Any]]
    if clip.media_type.startswith("text/"):
        text = clip.data.decode("utf-8")
        fields = [{"text": text[i:i + CLIP_PART_CHARS]}
                  for i in range(0, len(text), CLIP_PART_CHARS)] or [{"text": ""}]
    else:
        fields = [{"data": base64.b64encode(clip.data[i:i + PUT_CHUNK]).decode()}
                  for i in range(0, len(clip.data), PUT_CHUNK)] or [{"data": ""}]
    total = 0
    for i, part in enumerate(fields):
        body = await guest.request("clipboard_write", timeout=timeout, selection=selection,
                                   mediaType=clip.media_type, continues=i + 1 < len(fields), **part)
        got = body.get("bytes")
        total = got if _int(got) else total
    return total


__all__ = [
    "CLIP_TYPES", "MAX_CLIP_IMAGE", "MAX_DROP_BYTES", "MAX_DROP_FILES", "MAX_FILE_BYTES", "SELECTIONS",
    "Clip", "Drop", "DropEvent", "DropReceiver", "DropSession", "DropTarget", "FileOut", "FileSink",
    "GuestLanes", "Lanes", "SavedFile", "Sink", "Source", "check_name",
    "write_selection",
]
