"""The file ops: drops (``file_put_*``, ``file_commit``, ``file_abort``: written to a temporary
file, checked against the host's sha256, then linked under a free name) and reads
(``file_read``, streamed under the host's ``file_ack`` credit).
"""

from __future__ import annotations

import binascii
import contextlib
import errno
import hashlib
import os
import pwd
import secrets
import stat
import time
from typing import Any

from rigd_agent.base import BadRequest, Refused, clip, close_quietly, describe_oserror, field_int, field_str
from rigd_agent.core import AgentCore
from rigd_agent.files import (
    DROP_B64_MAX,
    DROP_FILE_MAX,
    DROP_MAX_OPEN,
    DROP_NAME_TRIES,
    DROP_PART_MAX,
    DROP_STALE_S,
    DROP_TEMP,
    READ_BUF,
    READ_CHUNK,
    READ_STALL_S,
    Drop,
    FileRead,
    check_drop_name,
    field_handles,
    field_path,
    field_sha256,
    file_kind,
    final_names,
    make_dirs,
    open_dir,
)


class FileOps(AgentCore):
    def op_file_put_open(self, rid: int, req: dict[str, Any]) -> None:
        where = field_path(req, "dir")
        if not where:
            raise BadRequest("dir is required: an absolute path or ~/…")
        name = check_drop_name(req.get("name"))
        owner = field_str(req, "owner")
        if owner is None:
            owner = "root"
        if not owner or len(owner) > 256:
            raise BadRequest("owner must be a user name")
        try:
            user = pwd.getpwnam(owner)
        except KeyError:
            raise Refused(f"no such user: {clip(owner, 100)}") from None
        if where == "~" or where.startswith("~/"):
            where = user.pw_dir + where[1:]
        if not where.startswith("/"):
            raise BadRequest("dir must be absolute or start with ~/")
        where = os.path.normpath(where)
        with self.files_lock:
            if sum(d.fd is not None for d in self.drops.values()) >= DROP_MAX_OPEN:
                raise Refused("too many open drops")
        make_dirs(where, user.pw_uid, user.pw_gid)
        resolved = os.path.realpath(where)
        dfd = open_dir(resolved)
        try:
            self._sweep_drops(dfd)
            temp = f".rigd-drop-{secrets.token_hex(8)}.part"
            flags = os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC
            fd = os.open(temp, flags, 0o600, dir_fd=dfd)
        except BaseException:
            os.close(dfd)
            raise
        try:
            os.fchown(fd, user.pw_uid, user.pw_gid)
            ino = os.fstat(fd).st_ino
        except BaseException:
            os.close(fd)
            with contextlib.suppress(OSError):
                os.unlink(temp, dir_fd=dfd)
            os.close(dfd)
            raise
        with self.files_lock:
            handle = self.next_drop
            self.next_drop += 1
            self.drops[handle] = Drop(handle, resolved, dfd, temp, name, fd, ino)
        self.ok(rid, handle=handle, dir=resolved)

    def _sweep_drops(self, dfd: int) -> None:
        """Remove temp files of this directory that no drop owns and nobody wrote for an hour."""
        st = os.fstat(dfd)
        here = (st.st_dev, st.st_ino)
        with self.files_lock:
            owned = {d.temp for d in self.drops.values() if d.dir_id == here}
        now = time.time()
        with contextlib.suppress(OSError), os.scandir(dfd) as entries:
            for entry in entries:
                if not DROP_TEMP.match(entry.name) or entry.name in owned:
                    continue
                with contextlib.suppress(OSError):
                    st = entry.stat(follow_symlinks=False)
                    if stat.S_ISREG(st.st_mode) and now - st.st_mtime > DROP_STALE_S:
                        os.unlink(entry.name, dir_fd=dfd)

    def _drop(self, req: dict[str, Any]) -> Drop:
        handle = field_int(req, "handle", required=True)
        with self.files_lock:
            drop = self.drops.get(handle)  # type: ignore[arg-type]
        if drop is None:
            raise Refused(f"no such drop: {handle}")
        return drop

    def _remove_drop(self, drop: Drop) -> None:
        """Delete the drop's temp file and forget it. Holds ``drop.lock``."""
        if drop.gone:
            return
        drop.gone = True
        if drop.fd is not None:
            close_quietly(drop.fd)
            drop.fd = None
        with contextlib.suppress(OSError):
            os.unlink(drop.temp, dir_fd=drop.dfd)
        self._forget_drop(drop)

    def _forget_drop(self, drop: Drop) -> None:
        drop.gone = True
        with self.files_lock:
            self.drops.pop(drop.handle, None)
        close_quietly(drop.dfd)

    def op_file_put_data(self, rid: int, req: dict[str, Any], data: bytes | None = None) -> None:
        """``data``: already decoded by the fast path in ``_handle_line``."""
        offset = field_int(req, "offset", required=True, lo=0)
        if data is None:
            value = req.get("data")
            if not isinstance(value, str):
                raise BadRequest("data is required and must be a base64 string")
            if len(value) > DROP_B64_MAX:
                raise BadRequest(f"data is over {DROP_PART_MAX} bytes")
            try:
                data = binascii.a2b_base64(value, strict_mode=True)  # the fastest decoder in the stdlib
            except (binascii.Error, ValueError):
                raise BadRequest("data is not valid base64") from None
        if len(data) > DROP_PART_MAX:
            raise BadRequest(f"data is over {DROP_PART_MAX} bytes")
        drop = self._drop(req)
        with drop.lock:
            if drop.gone:
                raise Refused(f"no such drop: {drop.handle}")
            if drop.fd is None:
                raise Refused(f"drop {drop.handle} is closed")
            if offset != drop.written:
                raise Refused(f"offset {offset} does not follow {drop.written}")
            if drop.written + len(data) > DROP_FILE_MAX:
                self._remove_drop(drop)
                raise Refused(f"drop {drop.handle} is over the {DROP_FILE_MAX}-byte limit: removed it")
            view = memoryview(data)
            try:
                while view:
                    view = view[os.write(drop.fd, view) :]
            except OSError as exc:
                # What reached the file is unknown now: the drop cannot be finished.
                self._remove_drop(drop)
                raise Refused(describe_oserror(exc, drop.path) + ": removed the drop") from None
            drop.sha.update(data)
            drop.written += len(data)
            total = drop.written
        self.ok(rid, bytes=total)

    def op_file_put_close(self, rid: int, req: dict[str, Any]) -> None:
        nbytes = field_int(req, "bytes", required=True, lo=0)
        digest = field_sha256(req, "sha256")
        drop = self._drop(req)
        with drop.lock:
            if drop.gone:
                raise Refused(f"no such drop: {drop.handle}")
            if drop.fd is None:
                raise Refused(f"drop {drop.handle} is already closed")
            fd, drop.fd = drop.fd, None
            try:
                os.fsync(fd)
            except OSError as exc:
                self._remove_drop(drop)
                raise Refused(describe_oserror(exc, drop.path) + ": removed the drop") from None
            finally:
                close_quietly(fd)
            got = drop.sha.hexdigest()
            if (got, drop.written) != (digest, nbytes):
                self._remove_drop(drop)
                raise Refused(f"digest mismatch: the guest wrote {drop.written} bytes with sha256 {got}; "
                              f"the host sent {nbytes} bytes with sha256 {digest}")  # fmt: skip
            drop.digest = got
            written = drop.written
        self.ok(rid, bytes=written, sha256=got)

    def op_file_commit(self, rid: int, req: dict[str, Any]) -> None:
        handles = field_handles(req)
        with self.files_lock:
            drops = [self.drops.get(h) for h in handles]
        for handle, drop in zip(handles, drops, strict=True):
            if drop is None or drop.gone:
                raise Refused(f"no such drop: {handle}; nothing was committed")
            if drop.digest is None:
                raise Refused(f"drop {handle} is not closed and verified; nothing was committed")
        chosen: list[tuple[Drop, str]] = []
        try:
            for drop in drops:
                assert drop is not None
                chosen.append((drop, self._link_final(drop)))
        except (OSError, Refused) as exc:
            for drop, final in chosen:  # a name os.link made is ours: take it back
                with contextlib.suppress(OSError):
                    os.unlink(final, dir_fd=drop.dfd)
            why = describe_oserror(exc) if isinstance(exc, OSError) else str(exc)
            raise Refused(f"commit failed, nothing was committed: {why}") from None
        paths: list[str] = []
        for drop, final in chosen:
            with contextlib.suppress(OSError):
                os.unlink(drop.temp, dir_fd=drop.dfd)
            self._publish_mode(drop, final)
            paths.append(os.path.join(drop.dir, final))
            self._forget_drop(drop)
        self.ok(rid, paths=paths)

    @staticmethod
    def _link_final(drop: Drop) -> str:
        """Link the temp file under the first free final name: never over an existing file."""
        for final in final_names(drop.name):
            try:
                os.link(drop.temp, final, src_dir_fd=drop.dfd, dst_dir_fd=drop.dfd, follow_symlinks=False)
            except FileExistsError:
                continue
            except OSError as exc:
                raise OSError(exc.errno, exc.strerror, os.path.join(drop.dir, final)) from None
            return final
        raise Refused(f"no free name for {drop.name} in {drop.dir} (up to {DROP_NAME_TRIES}-{drop.name})")

    @staticmethod
    def _publish_mode(drop: Drop, final: str) -> None:
        """chmod 0644 the committed file — through an fd of the very inode we wrote."""
        with contextlib.suppress(OSError):
            flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
            fd = os.open(final, flags, dir_fd=drop.dfd)
            try:
                if os.fstat(fd).st_ino == drop.ino:
                    os.fchmod(fd, 0o644)
            finally:
                os.close(fd)

    def op_file_abort(self, rid: int, req: dict[str, Any]) -> None:
        handles = field_handles(req)
        with self.files_lock:
            drops = [d for d in (self.drops.pop(h, None) for h in handles) if d is not None]
        for drop in drops:
            with drop.lock:
                self._remove_drop(drop)
        self.ok(rid, removed=len(drops))

    def op_file_read(self, rid: int, req: dict[str, Any]) -> None:
        try:
            path = field_path(req, "path")
            if not path or not path.startswith("/"):
                raise BadRequest("path must be an absolute path")
            limit = field_int(req, "maxBytes", required=True, lo=0, hi=2**53)
            window = field_int(req, "window", required=True, lo=1, hi=2**53)
            assert limit is not None and window is not None
            with self.files_lock:
                state = self.reads.setdefault(rid, FileRead(window))
            with state.cond:
                state.window = window
            self._file_read(rid, path, limit, state)
        finally:
            with self.files_lock:
                self.reads.pop(rid, None)

    def _file_read(self, rid: int, path: str, limit: int, state: FileRead) -> None:
        try:
            # O_NONBLOCK: opening a FIFO must not wait for a writer.
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
        except OSError as exc:
            if exc.errno == errno.ENXIO:  # a socket cannot be opened at all
                with contextlib.suppress(OSError):
                    if stat.S_ISSOCK(os.stat(path).st_mode):
                        raise Refused("not a regular file: socket") from None
            raise
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise Refused(f"not a regular file: {file_kind(st.st_mode)}")
            if st.st_size > limit:
                raise Refused(f"file is {st.st_size} bytes, over the limit of {limit}")
            size, digest = self._hash_file(fd, limit, state)
            self.chan.send({"id": rid, "ev": "meta", "bytes": size, "sha256": digest,
                            "name": os.path.basename(path), "mode": stat.S_IMODE(st.st_mode)})  # fmt: skip
            sent, digest = self._send_file(rid, fd, size, state)
        finally:
            os.close(fd)
        self.ok(rid, bytes=sent, sha256=digest)

    @staticmethod
    def _hash_file(fd: int, limit: int, state: FileRead) -> tuple[int, str]:
        """The first pass: size and sha256 of what the file holds now (up to ``limit``)."""
        sha = hashlib.sha256()
        buf = bytearray(READ_BUF)
        view = memoryview(buf)
        size = 0
        while True:
            if state.cancelled:
                raise Refused("cancelled")
            n = os.readv(fd, [view])
            if not n:
                return size, sha.hexdigest()
            size += n
            if size > limit:  # grew since the fstat (or a /proc-like file with no size)
                raise Refused(f"file is at least {size} bytes, over the limit of {limit}")
            sha.update(view[:n])

    def _send_file(self, rid: int, fd: int, size: int, state: FileRead) -> tuple[int, str]:
        """The second pass: ``data`` events in order, never more than the window past the acks."""
        sha = hashlib.sha256()
        buf = bytearray(READ_CHUNK)
        view = memoryview(buf)
        os.lseek(fd, 0, os.SEEK_SET)
        prefix = b'{"id":%d,"ev":"data","offset":' % rid
        offset = 0
        while offset < size:
            with state.cond:
                stalled = time.monotonic() + READ_STALL_S
                while not state.cancelled and state.acked + state.window <= offset:
                    acked = state.acked
                    state.cond.wait(min(5.0, stalled - time.monotonic()))
                    if state.acked != acked:
                        stalled = time.monotonic() + READ_STALL_S
                    elif time.monotonic() >= stalled:
                        raise Refused(f"the host acknowledged nothing for {READ_STALL_S:.0f} s")
                if state.cancelled:
                    raise Refused("cancelled")
                want = min(READ_CHUNK, size - offset, state.acked + state.window - offset)
            n = os.readv(fd, [view[:want]])
            if not n:
                break  # shrank since the first pass: the reply's count says so
            with state.cond:
                state.sent = offset + n  # before the write: an ack may overtake our return from it
            piece = view[:n]
            sha.update(piece)
            # Built by hand: base64 needs no JSON escaping, and json.dumps of a
            # big string costs more than the encoding itself.
            line = [prefix, b"%d" % offset, b',"data":"', binascii.b2a_base64(piece, newline=False), b'"}\n']
            if not self.chan.send_parts(line):
                raise Refused("the channel to the host failed")
            offset += n
        return offset, sha.hexdigest()

    def op_file_ack(self, rid: int, req: dict[str, Any]) -> None:
        read = field_int(req, "read", required=True)
        offset = field_int(req, "offset", required=True, lo=0)
        assert offset is not None
        with self.files_lock:
            state = self.reads.get(read)  # type: ignore[arg-type]
        if state is None:
            self.ok(rid, known=False)
            return
        with state.cond:
            # never credit more than was sent: the window stays the window
            state.acked = max(state.acked, min(offset, state.sent))
            state.cond.notify_all()
        self.ok(rid, known=True)

    def op_file_read_cancel(self, rid: int, req: dict[str, Any]) -> None:
        read = field_int(req, "read", required=True)
        with self.files_lock:
            state = self.reads.get(read)  # type: ignore[arg-type]
        if state is not None:
            with state.cond:
                state.cancelled = True
                state.cond.notify_all()
        self.ok(rid)

