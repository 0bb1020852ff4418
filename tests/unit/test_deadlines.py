"""A hung trio test fails at its own deadline, at the await it was stuck in, and the
worker's next trio test runs (tests/deadlines.py): before it, pytest-timeout's
signal left the run loop half-unwound and the next test failed with "Attempted to
call run() from inside a run()"."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.deadlines import trio_deadline

pytest_plugins = ["pytester"]
REPO = Path(__file__).resolve().parents[2]

INNER_CONFTEST = 'pytest_plugins = ["tests.deadlines"]\n'

INNER_TESTS = '''
import pytest
import trio


@pytest.fixture
async def resource():
    yield "held"
    await trio.sleep(0)


@pytest.mark.timeout(3)
async def test_hangs(resource):
    await trio.sleep_forever()  # the await that hangs


@pytest.mark.timeout(3)
async def test_after_the_hang():
    await trio.sleep(0.01)


async def test_without_a_timeout_keeps_trio_run():
    await trio.sleep(0)
'''


def test_the_deadline_falls_before_pytest_timeout() -> None:
    assert trio_deadline(120) == 114
    assert trio_deadline(600) == 570
    assert trio_deadline(8) == 4  # never less than half
    assert all(0 < trio_deadline(t) < t for t in (1, 3, 30, 120, 900))


@pytest.mark.timeout(60)
def test_a_hung_trio_test_fails_where_it_waited_and_the_next_one_runs(
        pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONPATH", str(REPO))
    pytester.makeconftest(INNER_CONFTEST)
    pytester.makeini("[pytest]\ntrio_mode = true\n")
    pytester.makepyfile(test_inner=INNER_TESTS)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-q")
    result.assert_outcomes(passed=2, failed=1)
    out = result.stdout.str()
    assert "no end within its trio deadline of 1.5 s" in out
    assert "await trio.sleep_forever()  # the await that hangs" in out
    assert "Timeout (>3.0s) from pytest-timeout" not in out
    assert "run() from inside a run()" not in out
