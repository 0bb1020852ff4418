"""A rig's evidence on disk: its console, QMP transcript and QEMU's stderr.

Set ``RIGD_EVIDENCE_DIR`` and every machine teardown writes
``<dir>/<rigId>/console.log``, ``qmp.log`` and ``qemu-stderr.log``; the test
fixtures point it at a per-test directory and keep it only for a failed test
(as QEMU's avocado tests and Firecracker's test framework keep a failed VM's
logs). Unset, nothing is written. The files can hold what a guest printed,
so they are the server user's alone (0600 files in a 0700 directory); what a
user typed is never in them (the QMP transcript withholds key events, see
:mod:`rigd.protocols.qmp_transcript`). Writing is best effort: a teardown
must finish whatever the disk says, so a failure is a warning in the log,
never an exception.
"""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path

ENV = "RIGD_EVIDENCE_DIR"

#: A rig id becomes one path component: nothing that could climb out of the directory.
_SAFE_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")


def evidence_dir() -> Path | None:
    """Where rigs' evidence goes (``$RIGD_EVIDENCE_DIR``), or None when unset or empty."""
    raw = os.environ.get(ENV)
    return Path(raw) if raw else None


def write_evidence(rig_id: str, *, console: str, qmp: str, stderr: str, log: logging.Logger) -> None:
    """Write the rig's three files under :func:`evidence_dir` (replacing earlier ones).

    Does nothing when the variable is unset; never raises: a rig id that is
    not a plain name or a failed write is logged as a warning.
    """
    root = evidence_dir()
    if root is None:
        return
    if not _SAFE_ID.fullmatch(rig_id) or ".." in rig_id:
        log.warning("evidence not kept: the rig id is not a plain name", extra={"rig": rig_id[:80]})
        return
    target = root / rig_id
    try:
        root.mkdir(mode=0o700, parents=True, exist_ok=True)
        target.mkdir(mode=0o700, exist_ok=True)
        os.chmod(target, 0o700)  # it may have existed with a wider mode
        for name, text in (("console.log", console), ("qmp.log", qmp), ("qemu-stderr.log", stderr)):
            _write_private(target / name, text)
    except (OSError, ValueError) as exc:  # ValueError: a NUL in the configured path
        log.warning("evidence not kept", extra={"path": str(target), "error": str(exc)})


def _write_private(path: Path, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    with open(fd, "wb") as f:
        os.fchmod(fd, 0o600)  # an existing file keeps its mode through O_CREAT
        f.write(text.encode("utf-8", "replace"))
