"""Cleanups that must never fail their caller, and must never fail silently (netgate's
namespaces and rigd's scratch directories alike).

A teardown that raises can hide the error that caused it, so removing
scratch directories is best effort; but a directory that could not be
removed is disk that leaks, so it is logged (a warning naming the path and
the error) instead of being swallowed by ``ignore_errors=True``.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path


def remove_tree(path: Path, *, log: logging.Logger) -> bool:
    """Remove ``path`` and all under it; True when nothing is left.

    Never raises: a failure is a warning with the path and the error, and
    whatever can still be removed is.
    """
    try:
        shutil.rmtree(path)
    except FileNotFoundError:
        pass  # gone already (or raced away part-way): what a cleanup wants
    except OSError as exc:
        log.warning("cleanup failed: cannot remove %s: %s", path, exc.strerror or exc)
        shutil.rmtree(path, ignore_errors=True)
    return not path.exists() and not path.is_symlink()
