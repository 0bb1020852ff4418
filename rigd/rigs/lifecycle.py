"""The rig state machine: one transition table and one guard.

::

    provisioning ──► ready ──► closing ──► closed
         │  │          │  ▲        ▲
         │  │          ▼  │        │
         │  │        parked ───────┘
         │  └────────────────────► closing
         └──► failed ──► closing   (a failed rig is closed to free its row)

``failed`` means the machine died or never came up; it is distinct from
``closed`` so a UI can offer a retry. Closing a failed rig keeps ``failed``'s
reason in the row and moves it to ``closed``.
"""

from __future__ import annotations

from rigd.errors import Conflict
from rigd.model import Phase

TRANSITIONS: dict[Phase, frozenset[Phase]] = {
    Phase.PROVISIONING: frozenset({Phase.READY, Phase.FAILED, Phase.CLOSING}),
    Phase.READY: frozenset({Phase.PARKED, Phase.CLOSING, Phase.FAILED}),
    Phase.PARKED: frozenset({Phase.READY, Phase.CLOSING, Phase.FAILED}),
    Phase.CLOSING: frozenset({Phase.CLOSED}),
    Phase.FAILED: frozenset({Phase.CLOSING, Phase.CLOSED}),
    Phase.CLOSED: frozenset(),
}

LIVE: frozenset[Phase] = frozenset({Phase.PROVISIONING, Phase.READY, Phase.PARKED})
#: Phases in which a machine process may exist and must be cleaned up.
HAS_MACHINE: frozenset[Phase] = frozenset(
    {Phase.PROVISIONING, Phase.READY, Phase.PARKED, Phase.CLOSING}
)


class InvalidTransition(Conflict):
    def __init__(self, current: Phase, target: Phase) -> None:
        allowed = ", ".join(sorted(TRANSITIONS[current])) or "nothing"
        super().__init__(
            f"rig is {current}; cannot become {target} (from {current} it may become {allowed})",
            phase=str(current),
        )


class WrongPhase(Conflict):
    def __init__(self, current: Phase, required: frozenset[Phase], doing: str) -> None:
        need = " or ".join(sorted(required))
        super().__init__(f"cannot {doing}: rig is {current}, must be {need}", phase=str(current))


def can_transition(current: Phase, target: Phase) -> bool:
    return target in TRANSITIONS[current]


def check_transition(current: Phase, target: Phase) -> None:
    """The one guard for phase changes."""
    if target not in TRANSITIONS[current]:
        raise InvalidTransition(current, target)


def require_phase(current: Phase, required: frozenset[Phase], doing: str) -> None:
    """The guard for operations: raise an error naming the current and required phase."""
    if current not in required:
        raise WrongPhase(current, required, doing)
