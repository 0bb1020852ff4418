"""Constants, diagnostics and the small helpers every concern uses: parsing a request's fields
into typed values (a bad one is :class:`BadRequest` naming it), clean child environments,
killing a process tree.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import os
import sys
from typing import Any

PROTO = 1  # the terminal agent: exec, ptys, reseed


PROTO_DESKTOP = 2  # with an X session: frames, pointer, modes, selections (docs/guest-protocol.md)


PORT_NAME = "rigd.agent"


MAX_LINE = 1 << 20  # bytes per line, newline excluded, both directions


CHUNK = 48 * 1024  # raw bytes per streamed chunk (64 KiB once base64'd)


DEFAULT_MAX_OUTPUT = 2 << 20  # bytes per exec stream


LINGER_S = 1.0  # how long output is still forwarded after the leader exits


KILL_GIVE_UP_S = 5.0  # after SIGKILL, stop waiting for a process stuck in D state


PTY_CLOSE_GRACE_S = 1.0  # SIGHUP, then SIGKILL after this long


PTY_DRAIN_IDLE_S = 0.05  # after the shell exits, stop once the pty is quiet this long


PTY_DRAIN_MAX_S = 1.0


PTY_INPUT_BACKLOG = 4 << 20


MAX_ERROR_TEXT = 4096


# hello sets the clock when it is further off than this: a restored snapshot's clock is stale by
# the time since the snapshot, a cold boot's by up to a second (the RTC counts whole seconds).
CLOCK_SLACK_S = 0.25


CLEAN_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


TERM = "xterm-256color"


BUSYBOX = "/.rigd/bin/busybox"


RB_POWER_OFF = 0x4321FEDC


PR_SET_CHILD_SUBREAPER = 36


RNDADDENTROPY = 0x40085203  # _IOW('R', 0x03, int[2])


RNDRESEEDCRNG = 0x5207  # _IO('R', 0x07)


SIOCSIFHWADDR = 0x8924


ARPHRD_ETHER = 1


MACHINE_ID_FILES = ("etc/machine-id", "var/lib/dbus/machine-id")


def log(msg: str) -> None:
    """Diagnostics go to stderr (the console in a guest), never to the channel."""
    with contextlib.suppress(Exception):
        sys.stderr.write(f"rigd-agent[{os.getpid()}]: {msg}\n")
        sys.stderr.flush()


class BadRequest(Exception):
    """A request is well-formed JSON but a field is missing or has a wrong type."""


class Refused(Exception):
    """A valid request that cannot be done here (bad cwd, unknown pty, …)."""


def clip(text: str, limit: int = MAX_ERROR_TEXT) -> str:
    return text if len(text) <= limit else text[:limit] + "…"


def describe_oserror(exc: OSError, what: str | None = None) -> str:
    """'no such file or directory: foo' — lower-case reason, then the culprit."""
    reason = (exc.strerror or str(exc) or type(exc).__name__).lower()
    name = what if what is not None else exc.filename
    if name is None:
        return reason
    if isinstance(name, bytes):
        name = name.decode("utf-8", "backslashreplace")
    return f"{reason}: {name}"


def clean_env(extra: dict[str, str] | None = None, term: str | None = None) -> dict[str, str]:
    """The only environment children ever see: nothing leaks from the agent's own."""
    env = {"PATH": CLEAN_PATH, "HOME": "/root", "LANG": "C.UTF-8"}
    if term is not None:
        env["TERM"] = term
    if extra:
        env.update(extra)
    return env


def default_cwd() -> str:
    return "/root" if os.path.isdir("/root") else "/"


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def field_int(
    req: dict[str, Any],
    name: str,
    *,
    default: int | None = None,
    lo: int | None = None,
    hi: int | None = None,
    required: bool = False,
) -> int | None:
    if name not in req or req[name] is None:
        if required:
            raise BadRequest(f"{name} is required")
        return default
    value = req[name]
    if type(value) is not int:
        raise BadRequest(f"{name} must be an integer")
    if (lo is not None and value < lo) or (hi is not None and value > hi):
        if hi is None:
            raise BadRequest(f"{name} must be at least {lo}")
        raise BadRequest(f"{name} must be between {lo} and {hi}")
    return value


def field_str(req: dict[str, Any], name: str) -> str | None:
    value = req.get(name)
    if value is None:
        return None
    if not isinstance(value, str) or "\0" in value:
        raise BadRequest(f"{name} must be a string without NUL")
    return value


def field_argv(req: dict[str, Any], *, required: bool) -> list[str] | None:
    argv = req.get("argv")
    if argv is None:
        if required:
            raise BadRequest("argv is required")
        return None
    if not isinstance(argv, list) or not argv or not all(isinstance(a, str) and "\0" not in a for a in argv):
        raise BadRequest("argv must be a non-empty list of strings without NUL")
    if not argv[0]:
        raise BadRequest("argv[0] must not be empty")
    return argv


def field_env(req: dict[str, Any]) -> dict[str, str] | None:
    env = req.get("env")
    if env is None:
        return None
    if not isinstance(env, dict):
        raise BadRequest("env must be an object of strings")
    for key, value in env.items():
        if not key or "=" in key or "\0" in key:
            raise BadRequest(f"env key {clip(key, 100)!r} is not a valid name")
        if not isinstance(value, str) or "\0" in value:
            raise BadRequest(f"env[{clip(key, 100)!r}] must be a string without NUL")
    return env


def field_b64(req: dict[str, Any], name: str, *, required: bool = False) -> bytes | None:
    value = req.get(name)
    if value is None:
        if required:
            raise BadRequest(f"{name} is required")
        return None
    if not isinstance(value, str):
        raise BadRequest(f"{name} must be a base64 string")
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise BadRequest(f"{name} is not valid base64") from None


def field_bool(req: dict[str, Any], name: str, *, default: bool) -> bool:
    value = req.get(name)
    if value is None:
        return default
    if type(value) is not bool:
        raise BadRequest(f"{name} must be a boolean")
    return value


def field_choice(req: dict[str, Any], name: str, choices: tuple[str, ...], *, default: str) -> str:
    value = req.get(name)
    if value is None:
        return default
    if value not in choices:
        raise BadRequest(f"{name} must be one of {', '.join(choices)}")
    return str(value)


def to_ms(seconds: float) -> int:
    return int(seconds * 1000)


def check_cwd(cwd: str) -> None:
    try:
        st = os.stat(cwd)
    except OSError as exc:
        raise Refused("cwd: " + describe_oserror(exc, cwd)) from None
    if not (st.st_mode & 0o170000 == 0o040000):
        raise Refused(f"cwd: not a directory: {cwd}")


def status_fields(returncode: int | None) -> dict[str, int | None]:
    if returncode is None:
        return {"exitCode": None, "signal": None}
    if returncode < 0:
        return {"exitCode": None, "signal": -returncode}
    return {"exitCode": returncode, "signal": None}


def kill_tree(leader: int, sig: int) -> None:
    """Signal the leader's process group and every process left in its session.

    The leader started with setsid(), so its pid names both its group and its
    session; job-control shells move jobs into other groups of the same
    session, which killpg alone would miss.
    """
    with contextlib.suppress(OSError):
        os.killpg(leader, sig)
    try:
        entries = os.listdir("/proc")
    except OSError:
        return
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
            # fields after the last ')' : state ppid pgrp session ...
            fields = stat[stat.rindex(b")") + 2 :].split()
            if int(fields[3]) == leader:
                os.kill(int(entry), sig)
        except (OSError, ValueError, IndexError):
            continue


def open_pidfd(pid: int) -> int | None:
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return None


def close_quietly(fd: int | None) -> None:
    if fd is not None:
        with contextlib.suppress(OSError):
            os.close(fd)

