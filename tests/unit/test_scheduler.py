"""Who parks, who is reaped, who is evicted — over plain snapshots and a fake clock."""

from __future__ import annotations

from dataclasses import replace

from rigd.model import CloseReason, Phase
from rigd.rigs.scheduler import Admit, Close, Park, Refuse, RigState, plan_admission, plan_idle

T0 = 1000.0


def rig(rid: str, *, active: float = T0, phase: Phase = Phase.READY, idle: float = 60,
        ttl: float = 3600, mb: int = 300, **kw: object) -> RigState:
    return RigState(id=rid, phase=phase, last_active=active, expires_at=T0 + ttl, idle_s=idle,
                    resident_mb=mb, **kw)  # type: ignore[arg-type]


def test_idle_parks_then_reaps_at_twice_the_interval() -> None:
    r = rig("a")
    assert plan_idle([r], T0 + 59) == []
    assert plan_idle([r], T0 + 60) == [Park("a")]
    parked = replace(r, phase=Phase.PARKED)
    assert plan_idle([parked], T0 + 119) == []
    assert plan_idle([parked], T0 + 120) == [Close("a", CloseReason.IDLE_TIMEOUT, reaped=True)]


def test_pins_prevent_parking_and_idle_reaping_but_not_ttl() -> None:
    pinned = [
        rig("term", terminals=1),
        rig("watched", watched_until=T0 + 10_000),
        rig("driven", controlled_by_person=True),
        rig("busy", busy=1),
    ]
    assert plan_idle(pinned, T0 + 500) == []
    assert plan_idle(pinned, T0 + 3600) == [
        Close(r.id, CloseReason.TTL_EXPIRED, reaped=True) for r in pinned
    ]


def test_a_lapsed_watch_no_longer_pins() -> None:
    r = rig("w", idle=20, watched_until=T0 + 30)
    assert plan_idle([r], T0 + 25) == []
    assert plan_idle([r], T0 + 31) == [Park("w")]


def test_closed_and_provisioning_rigs_are_left_alone() -> None:
    rigs = [rig("c", phase=Phase.CLOSED), rig("p", phase=Phase.PROVISIONING),
            rig("f", phase=Phase.FAILED)]
    assert plan_idle(rigs, T0 + 10_000) == []


def test_admission_fits_without_eviction() -> None:
    assert plan_admission([rig("a", mb=500)], budget_mb=1000, need_mb=400, now=T0) == Admit(())


def test_admission_evicts_least_recently_used_first() -> None:
    rigs = [rig("new", active=T0 + 30, mb=400), rig("old", active=T0, mb=400),
            rig("mid", active=T0 + 10, mb=400)]
    assert plan_admission(rigs, budget_mb=1300, need_mb=400, now=T0 + 40) == Admit(("old",))
    assert plan_admission(rigs, budget_mb=1300, need_mb=800, now=T0 + 40) == Admit(("old", "mid"))


def test_admission_never_evicts_pinned_driven_watched_or_busy() -> None:
    rigs = [rig("t", mb=400, terminals=1), rig("w", mb=400, watched_until=T0 + 100),
            rig("d", mb=400, controlled_by_person=True), rig("b", mb=400, busy=1)]
    decision = plan_admission(rigs, budget_mb=1700, need_mb=400, now=T0)
    assert isinstance(decision, Refuse)
    assert "1700 MB" in decision.reason
    for rid, why in (("t", "a terminal is open"), ("w", "someone is watching"),
                     ("d", "a person holds control"), ("b", "running an action")):
        assert f"{rid} (400 MB: {why})" in decision.reason


def test_admission_refuses_a_rig_bigger_than_the_budget() -> None:
    decision = plan_admission([], budget_mb=256, need_mb=512, now=T0)
    assert isinstance(decision, Refuse) and "larger than the whole memory budget" in decision.reason
