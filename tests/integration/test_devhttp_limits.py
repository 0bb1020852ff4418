"""The dev-domain router's request-head limit on a real loopback listener (no rig needed:
the head is measured before any route is looked up).

A head is at most 16 KiB (16384 bytes up to and including its blank line) however the
client splits it into writes, and a refused client reads a 431 — never a reset, even when
it sent far more than the limit in one write (closing a socket with unread bytes makes the
kernel answer RST; the router reads and drops the rest first)."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator

import pytest
import trio

from rigd.ports.devhttp import MAX_HEAD, DevDomains, DevServer

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(scope="module")
def router() -> Iterator[int]:
    """A DevServer on 127.0.0.1 in a thread of its own (no rigs: every routed name is a 404)."""
    ready = threading.Event()
    port: list[int] = []
    stop: list[trio.CancelScope] = []
    token: list[trio.lowlevel.TrioToken] = []

    async def main() -> None:
        server = DevServer(DevDomains(), lambda _rig: None, None)
        with trio.CancelScope() as scope:
            stop.append(scope)
            token.append(trio.lowlevel.current_trio_token())
            async with trio.open_nursery() as nursery:
                await nursery.start(server.run, 0, None)
                assert server.http_port is not None
                port.append(server.http_port)
                ready.set()

    thread = threading.Thread(target=trio.run, args=(main,), daemon=True)
    thread.start()
    assert ready.wait(10)
    yield port[0]
    trio.from_thread.run_sync(stop[0].cancel, trio_token=token[0])
    thread.join(10)


def head_of(size: int) -> bytes:
    """A request head of exactly ``size`` bytes (its blank line included)."""
    start = b"GET / HTTP/1.1\r\nHost: nothing.test\r\nX-Pad: "
    end = b"\r\n\r\n"
    return start + b"a" * (size - len(start) - len(end)) + end


def exchange(port: int, data: bytes, pieces: int, tail: bytes = b"") -> str:
    """Send ``data`` (+ ``tail``) in ``pieces`` writes; return the status line of the answer."""
    with socket.create_connection(("127.0.0.1", port), timeout=20) as s:
        step = max(1, -(-len(data) // pieces))
        for at in range(0, len(data), step):
            s.sendall(data[at:at + step])
        if tail:
            s.sendall(tail)
        answer = b""
        while b"\r\n" not in answer:
            chunk = s.recv(65536)  # ConnectionResetError here is the defect this module guards
            if not chunk:
                break
            answer += chunk
        return answer.split(b"\r\n", 1)[0].decode()


@pytest.mark.parametrize("pieces", [1, 2, 5, 100])
def test_a_head_of_16_kib_is_routed_and_one_byte_more_is_431(router: int, pieces: int) -> None:
    assert exchange(router, head_of(MAX_HEAD), pieces) == "HTTP/1.1 404 Not Found"
    assert exchange(router, head_of(MAX_HEAD + 1), pieces) == "HTTP/1.1 431 Request Header Fields Too Large"


@pytest.mark.parametrize("size", [20_040, 21_000, 64 * 1024, 512 * 1024])
def test_a_large_head_in_one_write_reads_431_not_a_reset(router: int, size: int) -> None:
    assert exchange(router, head_of(size), 1) == "HTTP/1.1 431 Request Header Fields Too Large"


def test_a_head_with_no_end_past_the_limit_is_431(router: int) -> None:
    endless = b"GET / HTTP/1.1\r\nHost: nothing.test\r\nX-Pad: " + b"a" * (MAX_HEAD * 2)
    assert exchange(router, endless, 3) == "HTTP/1.1 431 Request Header Fields Too Large"


def test_a_refused_route_with_a_body_still_reads_its_answer(router: int) -> None:
    head = b"POST / HTTP/1.1\r\nHost: nothing.test\r\nContent-Length: 300000\r\n\r\n"
    assert exchange(router, head, 1, tail=b"x" * 300_000) == "HTTP/1.1 404 Not Found"
