"""What a rig's failure says, whatever raised it.

A rig is a failure boundary (see :meth:`rigd.rigs.manager.RigManager._rig_task`):
errors from its tasks arrive plain or grouped (a nursery wraps them), and
the rig's ``failure`` must read as one sentence a person can act on. A
:class:`~rigd.errors.RigdError` is already such a sentence; a host
``OSError`` is said as one; anything else is a bug in rigd, said by its type
and message (its traceback goes to the server log, never to the rig).
"""

from __future__ import annotations

from collections.abc import Callable

from rigd.errors import RigdError, leaves


def describe_failure(
    exc: BaseException, console: Callable[[int], str] | None = None
) -> tuple[str, str | None]:
    """(the rig's failure text, its console tail) for an error from a rig's tasks.

    The first :class:`RigdError` wins (it names what went wrong and may carry
    the console it saw); then host errors; then anything else. Every further
    error is counted, so a grouped failure never hides that there were more.
    """
    found = list(leaves(exc)) or [exc]
    rigd = [e for e in found if isinstance(e, RigdError)]
    first = rigd[0] if rigd else next((e for e in found if isinstance(e, OSError)), found[0])
    if isinstance(first, RigdError):
        text = first.message
        seen = first.data.get("console")
        tail = seen if isinstance(seen, str) else None
    elif isinstance(first, OSError):
        text, tail = f"host error: {first}", None
    else:
        text, tail = f"internal error in the rig's tasks: {type(first).__name__}: {first}", None
    if len(found) > 1:
        text += f" (and {len(found) - 1} more error{'s' if len(found) > 2 else ''})"
    if tail is None and console is not None:
        try:
            tail = console(4096)
        except Exception:  # the console itself is broken: the failure text still stands
            tail = None
    return text, tail
