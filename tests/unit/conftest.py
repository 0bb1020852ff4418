"""Fixtures shared by unit modules: the running lanes world (tests/unit/test_lanes.py)
serves test_session and test_pages too; a module with its own ``world`` keeps it."""

from tests.unit.test_lanes import world

__all__ = ["world"]
