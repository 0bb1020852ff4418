"""Plugins and scheduling of the whole suite.

- The time budget (tests/budget.py): every item's setup, call and teardown,
  for ``scripts/test-budget``.
- Grouping for pytest-xdist (``make test`` runs two workers): the scheduler
  below hands a worker one group at a time, a group being a test module,
  so its module-scoped rigs and servers are made once, except that the
  modules of the shared desktop (``DESKTOP_MODULES``, every test that uses
  ``desktop_server``) are one group, so its data directory and warm
  snapshot serve them all on one worker. (xdist's own ``--dist loadgroup``
  marks do not survive pytest 9.2's node ids, so the grouping is ours.)
- Order: the heaviest groups first (the longest-running work starts while
  the other worker has plenty to take), then the rest of the integration
  tier, then the unit tier, whose many short modules fill the gaps at the end.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.budget import pytest_configure

#: A trio test's own deadline, before pytest-timeout's (tests/deadlines.py).
pytest_plugins = ["tests.deadlines"]

#: The modules whose tests use the shared desktop server: one group, one worker.
DESKTOP_MODULES = ("tests/integration/test_computer.py", "tests/integration/test_page.py")
DESKTOP = "desktop"
#: Groups that start first, longest first (scripts/test-budget shows what each costs): each
#: worker takes the next group when it is free, so the long modules start while the short ones
#: fill the gaps. (Tried: interleaving the CPU-busy groups with ones that mostly wait; the two
#: runs measured were ~4 min slower than this order's, on the same host.)
FIRST = (
    DESKTOP,
    "tests/integration/test_browser_rig.py",
    "tests/integration/test_firefox_rig.py",
    "tests/integration/test_desktop_boot.py",
    "tests/integration/test_warm_start.py",
    "tests/integration/test_netgate_usermode.py",
    "tests/integration/test_pressure.py",
    "tests/integration/test_custom_image.py",
    "tests/integration/test_webkit_rig.py",
)


def group_of(nodeid: str) -> str:
    module = nodeid.split("::", 1)[0]
    return DESKTOP if module in DESKTOP_MODULES else module


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    groups: dict[str, int] = {}
    for item in items:
        group = group_of(item.nodeid)
        groups.setdefault(group, len(groups))
        if "desktop_server" in getattr(item, "fixturenames", ()) and group != DESKTOP:
            raise pytest.UsageError(f"{item.nodeid} uses desktop_server: add its module to DESKTOP_MODULES "
                                    "in tests/conftest.py (the shared desktop's tests run on one worker)")

    def rank(item: pytest.Item) -> tuple[int, int, int]:
        group = group_of(item.nodeid)
        first = FIRST.index(group) if group in FIRST else len(FIRST)
        tier = 0 if "/integration/" in item.nodeid else 1
        return tier, first, groups[group]

    # A stable sort: each group keeps its tests in file order.
    items.sort(key=rank)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """Whole groups to a worker, in collection order (run with ``--no-loadscope-reorder``)."""
    from xdist.scheduler import LoadScopeScheduling

    class ByGroup(LoadScopeScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            return group_of(nodeid)

    return ByGroup(config, log)


__all__ = ["pytest_collection_modifyitems", "pytest_configure", "pytest_xdist_make_scheduler"]
