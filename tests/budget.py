"""The suite's time budget, kept visible (issue 25): every test item's setup,
call and teardown, written at the end of a run for ``scripts/test-budget``.

A pytest plugin (``tests/conftest.py`` loads it). It writes
``$RIGD_TEST_ARTIFACTS/budget/tests.json`` (default ``test-artifacts/``),
which the next change compares against; under pytest-xdist only the
controller writes, from the reports every worker sends it.
"""

from __future__ import annotations

import json
import os
import time
import zlib
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]


def budget_dir() -> Path:
    return Path(os.environ.get("RIGD_TEST_ARTIFACTS") or REPO / "test-artifacts") / "budget"


def host_probe() -> float:
    """Seconds one core takes for a fixed piece of pure-Python and zlib work, measured before
    the workers start: the same suite has taken 12.6 to 18 minutes on this kind of machine,
    so a run's figures are read beside its host's speed."""
    t0 = time.perf_counter()
    total = 0
    for i in range(5_000_000):
        total += i * i % 7
    zlib.compress(bytes(range(256)) * 40_000, 6)
    return round(time.perf_counter() - t0, 3)


class Budget:
    def __init__(self) -> None:
        self.started = time.time()
        self.items: dict[str, dict[str, Any]] = {}
        self.probe_s = host_probe()

    @pytest.hookimpl
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        row = self.items.setdefault(report.nodeid, {"setup": 0.0, "call": 0.0, "teardown": 0.0,
                                                    "outcome": "passed"})
        row[report.when] = round(row[report.when] + report.duration, 3)
        if report.when == "setup":
            row["start"] = round(getattr(report, "start", 0.0), 2)  # epoch seconds: a timeline
        if report.failed:
            row["outcome"] = "failed"
        elif report.skipped and row["outcome"] == "passed":
            row["outcome"] = "skipped"
        node = getattr(report, "node", None)
        worker = getattr(node, "gateway", None)
        if worker is not None:
            row["worker"] = worker.id

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        if not self.items:
            return
        out = budget_dir()
        try:
            out.mkdir(parents=True, exist_ok=True)
            doc = {"started": self.started, "wallS": round(time.time() - self.started, 1),
                   "exitStatus": int(exitstatus), "hostProbeS": self.probe_s, "items": self.items}
            tmp = out / "tests.json.tmp"
            tmp.write_text(json.dumps(doc, indent=0, sort_keys=True) + "\n")
            if (out / "tests.json").exists():  # the previous run, to compare against
                (out / "tests.json").replace(out / "tests.prev.json")
            tmp.replace(out / "tests.json")
        except OSError as exc:  # the budget is a report, never a reason to fail a run
            session.config.get_terminal_writer().line(f"test budget not written: {exc}")


def pytest_configure(config: pytest.Config) -> None:
    if hasattr(config, "workerinput"):
        return  # an xdist worker: the controller records what it reports
    config.pluginmanager.register(Budget(), "rigd-budget")
