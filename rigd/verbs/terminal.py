"""terminal_use: one verb, ``exec`` (API.md).

``{"action": "exec", "argv": ["ls", "-l"]}`` or
``{"action": "exec", "command": "make && ./run", "cwd": "/work",
"env": {"CI": "1"}, "stdin": "…", "timeoutS": 120}``

Rules (where API.md is silent, as noted):

- exactly one of ``argv`` (a non-empty list of strings; no NUL; ``argv[0]``
  not empty) or ``command`` (a non-empty string, run as ``bash -lc command``);
- ``cwd``: an absolute guest path. ``..`` is allowed: the path is inside the
  agent's own machine, so it confines nothing;
- ``env``: an object of name → string, names ``[A-Za-z_][A-Za-z0-9_]*``,
  values without NUL (execve cannot carry them). Added to the guest's
  environment;
- ``stdin``: a string (NUL allowed: it is a byte stream), sent UTF-8 encoded
  and then closed. Without it the command's stdin is empty (``/dev/null``);
- ``timeoutS``: a number, more than 0 and at most 3600; default 60;
- ``user``: who runs it. A computer rig runs commands as its desktop's own
  user in the X session by default (``rig``), or as ``root``; a terminal or
  browser rig runs them as ``root`` (the only value it takes). Checked per
  surface by the rig (``rigd.rigs``), parsed here as a user name.

Audit: ``command``/``argv``/``cwd`` are kept; ``stdin`` and every ``env``
value are masked (they often hold secrets), ``env`` names are kept.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace

from rigd.errors import FieldError
from rigd.verbs._args import Args, VerbSpec, table
from rigd.verbs.base import EXEC_TIMEOUT_DEFAULT_S, EXEC_TIMEOUT_MAX_S, TerminalAction
from rigd.verbs.masking import mask, mask_values

_USER = re.compile(r"[a-z_][a-z0-9_-]{0,31}")


@dataclass(frozen=True, slots=True)
class TerminalExec(TerminalAction):
    verb = "exec"

    argv: tuple[str, ...] | None
    command: str | None
    cwd: str | None = None
    env: tuple[tuple[str, str], ...] = field(default=(), repr=False)
    stdin: bytes | None = field(default=None, repr=False)
    timeout_s: float = EXEC_TIMEOUT_DEFAULT_S
    #: Who runs it (None: the surface's default).
    user: str | None = None

    @property
    def program(self) -> tuple[str, ...]:
        """The argv the guest runs: ``argv``, or ``bash -lc command``."""
        if self.argv is not None:
            return self.argv
        return ("bash", "-lc", self.command or "")

    @property
    def env_dict(self) -> dict[str, str]:
        return dict(self.env)


def _exec(a: Args) -> TerminalExec:
    has_argv, has_command = a.has("argv"), a.has("command")
    if has_argv and has_command:
        raise a.error("command", "give argv or command, not both")
    if not (has_argv or has_command):
        raise a.error(
            "argv",
            "is required: give argv (a list of strings) or command (a string run by bash -lc)",
        )
    argv = (
        a.argv("argv", string_hint="to run a shell line, pass it as command instead")
        if has_argv else None
    )
    command = a.string("command", max_chars=None) if has_command else None
    cwd = a.opt_abs_path("cwd", allow_dotdot=True)
    env = a.env("env")
    stdin = a.opt_text("stdin", allow_empty=True, allow_nul=True, max_bytes=None)
    timeout_s = a.number(
        "timeoutS", 0, EXEC_TIMEOUT_MAX_S, lo_open=True, default=EXEC_TIMEOUT_DEFAULT_S
    )
    user = a.string("user", max_chars=32) if a.has("user") else None
    if user is not None and not _USER.fullmatch(user):
        raise a.error("user", "is not a user name (lowercase letters, digits, _ and -)")
    return TerminalExec(
        user=user,
        argv=argv,
        command=command,
        cwd=cwd,
        env=env,
        stdin=None if stdin is None else stdin.encode("utf-8"),
        timeout_s=timeout_s,
    )


#: Run by bash as root: ``SESSION_WRAP user NAME=VALUE... -- argv...`` runs argv as ``user`` in its
#: X session — the environment of its running ``xfce4-session`` (display, X authority, session bus,
#: XDG dirs), else the image's defaults — with the caller's ``env`` over it.
SESSION_WRAP = r"""set -eu
u="$1"; shift
vars=(HOME="/home/$u" USER="$u" LOGNAME="$u" SHELL=/bin/bash PATH=/usr/local/bin:/usr/bin:/bin
      LANG=C.UTF-8 DISPLAY=:0 XAUTHORITY="/home/$u/.Xauthority")
pid=$(pgrep -o -u "$u" -x xfce4-session || true)
if [ -n "$pid" ] && [ -r "/proc/$pid/environ" ]; then
  while IFS= read -r -d '' kv; do
    case "$kv" in
      DISPLAY=*|XAUTHORITY=*|DBUS_SESSION_BUS_ADDRESS=*|XDG_RUNTIME_DIR=*|LANG=*|PATH=*) vars+=("$kv") ;;
      XDG_SESSION_*=*|XDG_CURRENT_DESKTOP=*|XDG_DATA_DIRS=*|XDG_CONFIG_DIRS=*) vars+=("$kv") ;;
    esac
  done <"/proc/$pid/environ"
fi
while [ "$#" -gt 0 ] && [ "$1" != "--" ]; do vars+=("$1"); shift; done
shift
exec setpriv --reuid="$u" --regid="$(id -g "$u")" --init-groups env -i "${vars[@]}" "$@"
"""


def as_user(action: TerminalExec, session_user: str | None) -> TerminalExec:
    """The exec a rig runs for ``action``: as root unchanged; as ``session_user`` (a computer
    rig's desktop user: its default) wrapped in :data:`SESSION_WRAP`, in its home unless a
    ``cwd`` was given. A user the rig does not have is a field error naming ``action.user``."""
    user = action.user or session_user or "root"
    if user == "root":
        return action
    if user != session_user:
        have = f"{session_user} (its desktop's user, the default) or root" if session_user else "root"
        raise FieldError("action.user", f"this rig runs commands as {have}, not {user}")
    env = [f"{k}={v}" for k, v in action.env]
    return replace(action, argv=("bash", "-c", SESSION_WRAP, "rigd-session", user, *env, "--",
                                 *action.program),
                   command=None, env=(), cwd=action.cwd or f"/home/{user}")


VERBS = table(
    VerbSpec(
        TerminalExec,
        ("argv", "command", "cwd", "env", "stdin", "timeoutS", "user"),
        _exec,
        refused={
            "timeout": "the field is timeoutS (seconds)",
            "timeout_s": "the field is timeoutS (seconds)",
        },
        audit={"stdin": mask, "env": mask_values},
    ),
)
