"""Identify host processes by pid *and* start time.

A pid alone can be recycled after a crash; with its start time (clock ticks
since boot, /proc/<pid>/stat field 22) it names one process for good, so
crash recovery never signals a stranger.
"""

from __future__ import annotations


def _proc_stat(pid: int) -> list[bytes] | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            raw = fh.read()
    except OSError:
        return None
    # The command name (field 2) may contain spaces and parentheses; the
    # fields after it start with the state (field 3).
    return raw[raw.rfind(b")") + 2 :].split()


def proc_alive(pid: int, start_ticks: int | None) -> bool:
    """True if ``pid`` is a live (not zombie) process that started at ``start_ticks``."""
    fields = _proc_stat(pid)
    if fields is None or start_ticks is None or fields[0] in (b"Z", b"X"):
        return False
    return proc_start_ticks(pid) == start_ticks


def proc_start_ticks(pid: int) -> int | None:
    """Process start time in clock ticks since boot (/proc/<pid>/stat field 22).

    With the pid it identifies a process uniquely, so crash recovery never
    kills a recycled pid.
    """
    rest = _proc_stat(pid)
    if rest is None:
        return None
    try:
        return int(rest[19])
    except (IndexError, ValueError):
        return None


def resident_mb(pid: int) -> int:
    """Resident set size of ``pid`` in MB (VmRSS), 0 if it is gone."""
    try:
        with open(f"/proc/{pid}/status", "rb") as fh:
            for line in fh:
                if line.startswith(b"VmRSS:"):
                    return int(line.split()[1]) // 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0
