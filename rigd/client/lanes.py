"""The client side of the lanes for ``rigd cp`` and ``rigd clip`` (standard library only).

Uploads stream each file from disk into one ``multipart/form-data`` body of
known length (each part declares its ``Repr-Digest``, so the server checks
it end to end); downloads stream to a temporary file beside the target and
are renamed only once the ``Repr-Digest`` matched.
"""

from __future__ import annotations

import base64
import hashlib
import http.client
import json
import os
import secrets
import sys
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

CHUNK = 1024 * 1024


class LaneError(Exception):
    pass


class Progress:
    """A one-line progress bar on stderr (only on a terminal, or when asked)."""

    def __init__(self, total: int, label: str, *, show: bool | None = None) -> None:
        self.total = max(total, 1)
        self.label = label
        self.done = 0
        self.started = time.monotonic()
        self.show = sys.stderr.isatty() if show is None else show
        self._last = 0.0

    def add(self, n: int) -> None:
        self.done += n
        now = time.monotonic()
        if self.show and (now - self._last > 0.2 or self.done >= self.total):
            self._last = now
            rate = self.done / max(now - self.started, 1e-6)
            eta = (self.total - self.done) / rate if rate > 0 else 0
            pct = 100 * self.done // self.total
            sys.stderr.write(f"\r{self.label}: {pct:3d}% {self.done / 1e6:.1f}/{self.total / 1e6:.1f} MB "
                             f"{rate / 1e6:.1f} MB/s ETA {eta:.0f}s ")
            sys.stderr.flush()

    def finish(self) -> None:
        if self.show:
            sys.stderr.write("\n")


def _conn(url: str, timeout: float) -> tuple[http.client.HTTPConnection, str]:
    parts = urllib.parse.urlsplit(url)
    cls = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    return cls(parts.netloc, timeout=timeout), parts.path.rstrip("/")


def _error(resp: http.client.HTTPResponse) -> LaneError:
    body = resp.read(65536)
    try:
        err = json.loads(body)["error"]
        data = err.get("data") or {}
        field = f" [{data['field']}: {data.get('reason', '')}]" if "field" in data else ""
        return LaneError(f"HTTP {resp.status}: {err.get('message')}{field}")
    except (ValueError, KeyError, TypeError):
        return LaneError(f"HTTP {resp.status}: {body[:200]!r}")


def _sha256_file(path: Path) -> bytes:
    sha = hashlib.sha256()
    with path.open("rb") as fh:
        while chunk := fh.read(CHUNK):
            sha.update(chunk)
    return sha.digest()


def _quote_name(name: str) -> str:
    return name.replace("\\", "\\\\").replace('"', '\\"')


class LaneClient:
    def __init__(self, url: str, token: str, *, timeout: float = 3600) -> None:
        self.url = url
        self.token = token
        self.timeout = timeout

    def _headers(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}", **(extra or {})}

    def upload(self, rig_id: str, paths: list[Path], *, show: bool | None = None,
               point: tuple[int, int] | None = None) -> dict[str, Any]:
        boundary = "rigd-" + secrets.token_hex(16)
        heads: list[bytes] = []
        for path in paths:
            if not path.is_file():
                raise LaneError(f"{path}: not a regular file")
            digest = base64.b64encode(_sha256_file(path)).decode()
            heads.append((f"--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; "
                          f"filename=\"{_quote_name(path.name)}\"\r\n"
                          f"Content-Type: application/octet-stream\r\n"
                          f"Repr-Digest: sha-256=:{digest}:\r\n\r\n").encode())
        tail = f"--{boundary}--\r\n".encode()
        sizes = [p.stat().st_size for p in paths]
        length = sum(len(h) for h in heads) + sum(sizes) + 2 * len(paths) + len(tail)
        progress = Progress(sum(sizes), f"drop {len(paths)} file(s)", show=show)

        def body() -> Iterator[bytes]:
            for head, path in zip(heads, paths, strict=True):
                yield head
                with path.open("rb") as fh:
                    while chunk := fh.read(CHUNK):
                        progress.add(len(chunk))
                        yield chunk
                yield b"\r\n"
            yield tail

        query = "" if point is None else f"?x={point[0]}&y={point[1]}"
        conn, base = _conn(self.url, self.timeout)
        try:
            conn.request("POST", f"{base}/rig/files/{rig_id}{query}", body=body(), headers=self._headers({
                "Content-Type": f"multipart/form-data; boundary={boundary}",
                "Content-Length": str(length)}))
            resp = conn.getresponse()
            if resp.status != 200:
                raise _error(resp)
            answer: dict[str, Any] = json.loads(resp.read())
        finally:
            progress.finish()
            conn.close()
        return answer

    def download(self, rig_id: str, guest: str, dest: Path, *, show: bool | None = None) -> dict[str, Any]:
        p = base64.urlsafe_b64encode(guest.encode()).decode().rstrip("=")
        conn, base = _conn(self.url, self.timeout)
        try:
            conn.request("GET", f"{base}/rig/files/{rig_id}?p={p}", headers=self._headers())
            resp = conn.getresponse()
            if resp.status != 200:
                raise _error(resp)
            size = int(resp.getheader("Content-Length", "0"))
            want = (resp.getheader("Repr-Digest") or "").removeprefix("sha-256=:").rstrip(":")
            if dest.is_dir():
                dest = dest / Path(guest).name
            return self._save(resp, dest, size, want, Progress(size, f"copy {Path(guest).name}", show=show))
        finally:
            conn.close()

    @staticmethod
    def _save(resp: BinaryIO | http.client.HTTPResponse, dest: Path, size: int, want: str,
              progress: Progress) -> dict[str, Any]:
        tmp = dest.with_name(f".{dest.name}.rigd-part")
        sha = hashlib.sha256()
        got = 0
        try:
            with tmp.open("wb") as fh:
                while chunk := resp.read(CHUNK):
                    fh.write(chunk)
                    sha.update(chunk)
                    got += len(chunk)
                    progress.add(len(chunk))
            progress.finish()
            if got != size or base64.b64encode(sha.digest()).decode() != want:
                raise LaneError(f"the download broke off or changed ({got} of {size} bytes, digest "
                                "mismatch); nothing was saved")
            os.replace(tmp, dest)
        finally:
            tmp.unlink(missing_ok=True)
        return {"path": str(dest), "bytes": got, "sha256": sha.hexdigest()}

    def clip_get(self, rig_id: str, selection: str = "clipboard") -> tuple[str | None, bytes]:
        conn, base = _conn(self.url, self.timeout)
        try:
            conn.request("GET", f"{base}/rig/clipboard/{rig_id}?selection={selection}",
                         headers=self._headers())
            resp = conn.getresponse()
            if resp.status == 204:
                resp.read()
                return None, b""
            if resp.status != 200:
                raise _error(resp)
            return resp.getheader("Content-Type"), resp.read()
        finally:
            conn.close()

    def clip_set(self, rig_id: str, data: bytes, media_type: str) -> dict[str, Any]:
        conn, base = _conn(self.url, self.timeout)
        try:
            conn.request("POST", f"{base}/rig/clipboard/{rig_id}", body=data,
                         headers=self._headers({"Content-Type": media_type}))
            resp = conn.getresponse()
            if resp.status != 200:
                raise _error(resp)
            answer: dict[str, Any] = json.loads(resp.read())
            return answer
        finally:
            conn.close()


def sniff_type(data: bytes) -> str:
    if data.startswith(b"\x89PNG\r\n\x1a\n"):
        return "image/png"
    if data.startswith(b"\xff\xd8\xff"):
        return "image/jpeg"
    return "text/plain; charset=utf-8"


def split_remote(arg: str) -> tuple[str, str] | None:
    """``rig_x:/path`` → (rig id, path); a local path → None."""
    head, sep, tail = arg.partition(":")
    if sep and head.startswith("rig_") and "/" not in head:
        return head, tail
    return None


__all__ = ["LaneClient", "LaneError", "Progress", "sniff_type", "split_remote"]
