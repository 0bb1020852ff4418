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
- ``timeoutS``: a number, more than 0 and at most 3600; default 60.

Audit: ``command``/``argv``/``cwd`` are kept; ``stdin`` and every ``env``
value are masked (they often hold secrets), ``env`` names are kept.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from rigd.verbs._args import Args, VerbSpec, table
from rigd.verbs.base import EXEC_TIMEOUT_DEFAULT_S, EXEC_TIMEOUT_MAX_S, TerminalAction
from rigd.verbs.masking import mask, mask_values


@dataclass(frozen=True, slots=True)
class TerminalExec(TerminalAction):
    verb = "exec"

    argv: tuple[str, ...] | None
    command: str | None
    cwd: str | None = None
    env: tuple[tuple[str, str], ...] = field(default=(), repr=False)
    stdin: bytes | None = field(default=None, repr=False)
    timeout_s: float = EXEC_TIMEOUT_DEFAULT_S

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
    return TerminalExec(
        argv=argv,
        command=command,
        cwd=cwd,
        env=env,
        stdin=None if stdin is None else stdin.encode("utf-8"),
        timeout_s=timeout_s,
    )


VERBS = table(
    VerbSpec(
        TerminalExec,
        ("argv", "command", "cwd", "env", "stdin", "timeoutS"),
        _exec,
        refused={
            "timeout": "the field is timeoutS (seconds)",
            "timeout_s": "the field is timeoutS (seconds)",
        },
        audit={"stdin": mask, "env": mask_values},
    ),
)
