"""Running code inside a named network namespace, from a process that stays outside it.

How this works: ``setns(2)`` with ``CLONE_NEWNET`` moves only the calling
*thread*. A socket keeps the namespace it was created in for its whole life,
whichever thread later uses it. So the gateway creates its listening sockets
on a short-lived thread that enters the gateway namespace, creates and binds
them, and dies — the sockets are then handed to Trio in the main thread,
which never leaves the host namespace. Threads that entered a namespace are
never returned to a pool (Trio's worker threads are reused; one left in the
wrong namespace would poison later work), hence the dedicated threads here.

Python 3.11 has no ``os.setns``; libc's is called through ctypes.
"""

from __future__ import annotations

import concurrent.futures
import ctypes
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")

NETNS_DIR = Path("/run/netns")
CLONE_NEWNET = 0x40000000

_libc = ctypes.CDLL(None, use_errno=True)


def netns_path(name: str) -> Path:
    if not name or "/" in name or name in (".", ".."):
        raise ValueError(f"bad namespace name {name!r}")
    return NETNS_DIR / name


def enter_netns(name: str) -> None:
    """Move the calling thread into namespace ``name`` (for good)."""
    fd = os.open(netns_path(name), os.O_RDONLY | os.O_CLOEXEC)
    try:
        if _libc.setns(fd, CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"setns into {name}: {os.strerror(err)}")
    finally:
        os.close(fd)


def run_in_netns(name: str, fn: Callable[..., T], *args: Any) -> T:
    """Run ``fn(*args)`` on a fresh thread inside namespace ``name``; return or raise its result.

    Blocking: call it through ``trio.to_thread.run_sync``.
    """
    result: list[T] = []
    error: list[BaseException] = []

    def body() -> None:
        try:
            enter_netns(name)
            result.append(fn(*args))
        except BaseException as exc:  # handed to the caller's thread
            error.append(exc)

    thread = threading.Thread(target=body, name=f"netns-{name}", daemon=True)
    thread.start()
    thread.join()
    if error:
        raise error[0]
    return result[0]


class NetnsExecutor:
    """One long-lived thread inside a namespace, for work that recurs (e.g. per-connection sockets)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._pool = concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix=f"netns-{name}", initializer=enter_netns, initargs=(name,))

    def submit(self, fn: Callable[..., T], *args: Any) -> concurrent.futures.Future[T]:
        return self._pool.submit(fn, *args)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
