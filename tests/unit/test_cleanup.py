"""Best-effort cleanups: never raise, never silent."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from netgate.cleanup import remove_tree

LOG = logging.getLogger("rigd.test")


def test_removes_a_tree_and_a_missing_one_is_fine(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    (tmp_path / "d" / "e").mkdir(parents=True)
    (tmp_path / "d" / "e" / "f").write_text("x")
    with caplog.at_level(logging.WARNING):
        assert remove_tree(tmp_path / "d", log=LOG)
        assert remove_tree(tmp_path / "never-was", log=LOG)
    assert not (tmp_path / "d").exists() and caplog.records == []


def test_a_failure_is_a_warning_with_path_and_error(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    plain = tmp_path / "plain-file"
    plain.write_text("x")
    with caplog.at_level(logging.WARNING):
        assert remove_tree(plain, log=LOG) is False  # rmtree refuses a file; nothing raised
    [record] = caplog.records
    assert record.levelno == logging.WARNING
    assert record.getMessage() == f"cleanup failed: cannot remove {plain}: Not a directory"
