"""A trio test's own deadline, a little before pytest-timeout's (a pytest plugin;
``tests/conftest.py`` loads it).

pytest-timeout's signal method raises from a SIGALRM handler wherever the main
thread is; inside ``trio.run`` that is the run loop's own ``epoll`` wait, so the
run never unwinds: the test fails with the loop's frame and nothing else, and
every later trio test on that worker fails with "Attempted to call run() from
inside a run()" (seen in CI: one hung test took the next one down). Here every
trio test that has a timeout runs under ``trio.fail_after`` that many seconds
less a margin: a hang cancels the test at the await it is stuck in (that frame
is in the failure's traceback), its async fixtures unwind, and the worker's
next test starts clean. pytest-timeout stays as the backstop for a test stuck
outside trio's reach (a blocking call in the run's own thread).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import trio

#: How much earlier than pytest-timeout the test's trio deadline falls.
MARGIN_S = 5.0
MARGIN_FRACTION = 0.05


def trio_deadline(timeout_s: float) -> float:
    """The trio deadline for a test that pytest-timeout stops after ``timeout_s``."""
    return max(timeout_s / 2, timeout_s - max(MARGIN_S, timeout_s * MARGIN_FRACTION))


def timeout_of(item: pytest.Item) -> float | None:
    marker = item.get_closest_marker("timeout")
    if marker is not None:
        value = marker.kwargs.get("timeout", marker.args[0] if marker.args else None)
    else:
        value = item.config.getoption("timeout", None) or item.config.getini("timeout")
    try:
        seconds = float(value) if value is not None and value != "" else 0.0
    except (TypeError, ValueError):
        return None
    return seconds if seconds > 0 else None


def bounded_run(seconds: float, nodeid: str) -> Callable[..., Any]:
    """A ``trio.run`` for pytest-trio's ``trio(run=...)`` marker: the test under a deadline."""

    def run(afn: Callable[[], Awaitable[Any]], *, clock: Any = None, instruments: Any = ()) -> Any:
        if clock is not None:  # a mock clock's time is not the wall's: pytest-timeout alone
            return trio.run(afn, clock=clock, instruments=instruments)

        async def bounded() -> Any:
            try:
                with trio.fail_after(seconds):
                    return await afn()
            except trio.TooSlowError:
                # The Cancelled this replaces (in the traceback above it) shows where the test waited.
                pytest.fail(f"{nodeid}: no end within its trio deadline of {seconds:g} s (pytest-timeout "
                            "would stop it a little later); the await it was stuck in is in the "
                            "traceback above", pytrace=True)

        return trio.run(bounded, clock=clock, instruments=instruments)

    return run


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.get_closest_marker("trio") is None or not isinstance(item, pytest.Function):
        return
    seconds = timeout_of(item)
    # trio_mode marks every async test with run=trio.run; a test that names another runner keeps it.
    if seconds is None or any(m.kwargs.get("run") not in (None, trio.run) for m in item.iter_markers("trio")):
        return
    # First among the item's trio marks: pytest-trio takes the first that names a runner.
    item.add_marker(pytest.mark.trio(run=bounded_run(trio_deadline(seconds), item.nodeid)), append=False)


__all__ = ["bounded_run", "pytest_runtest_setup", "timeout_of", "trio_deadline"]
