"""A rig's evidence files: where they go, their modes, and that a failure to
write them is a warning, never an exception."""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path

import pytest

from rigd.backends.evidence import ENV, evidence_dir, write_evidence

LOG = logging.getLogger("rigd.rig.r-test")


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_unset_means_nothing_is_written(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv(ENV, raising=False)
    monkeypatch.chdir(tmp_path)
    assert evidence_dir() is None
    write_evidence("r-1", console="boot", qmp="q", stderr="e", log=LOG)
    monkeypatch.setenv(ENV, "")
    assert evidence_dir() is None
    write_evidence("r-1", console="boot", qmp="q", stderr="e", log=LOG)
    assert list(tmp_path.iterdir()) == []


def test_three_private_files_per_rig(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    root = tmp_path / "evidence" / "nested"
    monkeypatch.setenv(ENV, str(root))
    assert evidence_dir() == root
    write_evidence("r-abc123", console="Linux version 6.1\nRIGD-AGENT-READY\n", qmp="+0.0 -> stop id=1\n",
                   stderr="qemu: warning: \udcff odd byte\n", log=LOG)
    rig = root / "r-abc123"
    assert sorted(p.name for p in rig.iterdir()) == ["console.log", "qemu-stderr.log", "qmp.log"]
    assert (rig / "console.log").read_text() == "Linux version 6.1\nRIGD-AGENT-READY\n"
    assert (rig / "qmp.log").read_text() == "+0.0 -> stop id=1\n"
    assert (rig / "qemu-stderr.log").read_text() == "qemu: warning: ? odd byte\n"
    assert mode(rig) == 0o700
    assert all(mode(p) == 0o600 for p in rig.iterdir())


def test_rewrite_replaces_and_narrows_modes(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(ENV, str(tmp_path))
    rig = tmp_path / "r-1"
    rig.mkdir(mode=0o755)
    (rig / "console.log").write_text("an older, longer console\n" * 10)
    os.chmod(rig / "console.log", 0o644)
    write_evidence("r-1", console="new\n", qmp="", stderr="", log=LOG)
    assert (rig / "console.log").read_text() == "new\n"
    assert mode(rig) == 0o700 and mode(rig / "console.log") == 0o600


def test_symlinked_file_is_not_followed(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                        caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setenv(ENV, str(tmp_path / "ev"))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.write_text("untouched")
    (tmp_path / "ev" / "r-1").mkdir(parents=True)
    (tmp_path / "ev" / "r-1" / "console.log").symlink_to(elsewhere)
    with caplog.at_level(logging.WARNING):
        write_evidence("r-1", console="guest output", qmp="", stderr="", log=LOG)
    assert elsewhere.read_text() == "untouched"
    [record] = caplog.records
    assert record.getMessage() == "evidence not kept"
    assert record.path == str(tmp_path / "ev" / "r-1")  # type: ignore[attr-defined]


def test_unwritable_directory_is_a_warning(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                           caplog: pytest.LogCaptureFixture) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    monkeypatch.setenv(ENV, str(blocker / "evidence"))
    with caplog.at_level(logging.WARNING):
        write_evidence("r-1", console="c", qmp="q", stderr="s", log=LOG)  # no exception
    [record] = caplog.records
    assert record.levelno == logging.WARNING and record.name == "rigd.rig.r-test"
    assert record.path == str(blocker / "evidence" / "r-1")  # type: ignore[attr-defined]
    assert "Not a directory" in record.error  # type: ignore[attr-defined]


@pytest.mark.parametrize("rig_id", ["../escape", "a/b", "..", "", ".hidden", "r-1\x00"])
def test_rig_id_that_is_not_a_plain_name(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                          caplog: pytest.LogCaptureFixture, rig_id: str) -> None:
    monkeypatch.setenv(ENV, str(tmp_path / "ev"))
    with caplog.at_level(logging.WARNING):
        write_evidence(rig_id, console="c", qmp="q", stderr="s", log=LOG)
    assert not (tmp_path / "ev").exists() and list(tmp_path.iterdir()) == []
    assert [r.getMessage() for r in caplog.records] == ["evidence not kept: the rig id is not a plain name"]
