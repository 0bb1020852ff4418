from __future__ import annotations

import pytest

from rigd.model import Phase
from rigd.rigs.lifecycle import (
    TRANSITIONS,
    InvalidTransition,
    WrongPhase,
    check_transition,
    require_phase,
)


def test_every_phase_has_a_row_and_closed_is_terminal() -> None:
    assert set(TRANSITIONS) == set(Phase)
    assert TRANSITIONS[Phase.CLOSED] == frozenset()


@pytest.mark.parametrize(
    ("current", "target"),
    [
        (Phase.PROVISIONING, Phase.READY),
        (Phase.PROVISIONING, Phase.FAILED),
        (Phase.READY, Phase.CLOSING),
        (Phase.CLOSING, Phase.CLOSED),
        (Phase.READY, Phase.FAILED),
        (Phase.FAILED, Phase.CLOSED),
    ],
)
def test_allowed(current: Phase, target: Phase) -> None:
    check_transition(current, target)


@pytest.mark.parametrize(
    ("current", "target"),
    [
        (Phase.CLOSED, Phase.READY),
        (Phase.CLOSING, Phase.READY),
        (Phase.FAILED, Phase.READY),
        (Phase.PROVISIONING, Phase.CLOSED),
    ],
)
def test_refused_with_names(current: Phase, target: Phase) -> None:
    with pytest.raises(InvalidTransition) as exc:
        check_transition(current, target)
    assert str(current) in exc.value.message and str(target) in exc.value.message


def test_require_phase_names_current_and_required() -> None:
    with pytest.raises(WrongPhase) as exc:
        require_phase(Phase.CLOSED, frozenset({Phase.READY}), "run terminal_use.exec")
    assert exc.value.message == "cannot run terminal_use.exec: rig is closed, must be ready"
