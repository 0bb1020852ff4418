"""A nursery whose body's own error comes out as itself.

Inside a Trio nursery, an exception from the ``async with`` body is raised
wrapped in an :class:`ExceptionGroup` (strict exception groups). The context
managers that run a task beside their caller's body (a connection's reader, a
driver's event reader, a machine's tasks) want the caller's error to come back
unchanged: :func:`body_nursery` yields the nursery, cancels it when the body
ends, and raises the body's error outside it. A leaf: it imports nothing from rigd.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import trio


@asynccontextmanager
async def body_nursery() -> AsyncIterator[trio.Nursery]:
    """A nursery for the body's length: cancelled when the body ends; the body's own
    exception is raised after it, unwrapped."""
    body_error: Exception | None = None
    async with trio.open_nursery() as nursery:
        try:
            yield nursery
        except Exception as exc:
            body_error = exc
        finally:
            nursery.cancel_scope.cancel()
    if body_error is not None:
        raise body_error


@asynccontextmanager
async def beside(task: Callable[..., Awaitable[object]]) -> AsyncIterator[None]:
    """Run ``task`` (started with ``nursery.start``, so it is running when the body starts)
    for the body's length, as :func:`body_nursery`."""
    async with body_nursery() as nursery:
        await nursery.start(task)
        yield


__all__ = ["beside", "body_nursery"]
