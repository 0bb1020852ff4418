"""A hostile guest: root inside the rig kills the agent and takes over its
channel — flooding it with garbage and an endless line, or going silent. The
server must stay responsive, other rigs unaffected, and the rig closable."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from tests.integration.conftest import ClientError, Server, exec_, open_terminal

pytestmark = [pytest.mark.vm, pytest.mark.timeout(300)]


@pytest.fixture
def server(shared_server: Server) -> Server:
    """The worker's shared server (tests/integration/conftest.py): none of these tests needs a
    fresh one, and each one's rigs are closed when it ends."""
    return shared_server


# Root inside the guest kills the agent, grabs its port before PID 1 can
# restart it, and writes random bytes, a 5 MB line without a newline, and
# forged replies, again and again. (Python here is the image's own.)
FLOOD_PY = """
import glob, os, time
port = next('/dev/' + os.path.basename(d) for d in glob.glob('/sys/class/virtio-ports/*')
            if open(d + '/name').read().strip() == 'rigd.agent')
time.sleep(1)
os.kill(int(open('/run/rigd-agent.pid').read()), 9)
while True:
    try:
        fd = os.open(port, os.O_WRONLY)
        break
    except OSError:
        pass
while True:
    os.write(fd, os.urandom(200000))
    os.write(fd, b'a' * 5000000)
    os.write(fd, b'\\n{"id": 999999, "ok": true}\\n{"ev": "ready"}\\n')
"""
FLOOD = f"cat > /tmp/flood.py <<'EOF'\n{FLOOD_PY}\nEOF\nsetsid python3 /tmp/flood.py </dev/null >/dev/null 2>&1 &"

SILENCE = "setsid sh -c 'sleep 1; kill -STOP $(cat /run/rigd-agent.pid)' </dev/null >/dev/null 2>&1 &"


def responsive(server: Server, rig_id: str) -> float:
    started = time.monotonic()
    assert server.call("rig.get", {"rigId": rig_id})["id"] == rig_id
    return time.monotonic() - started


#: How late a flooded server may answer and still count as serving.
RESPONSIVE_S = 10.0


ATTACKS = {"flood": FLOOD, "silence": SILENCE}


def withstand(server: Server, victim: str, attack: str) -> None:
    """Once ``attack`` runs in ``victim``: the agent is seen gone, an act on it comes back
    with the agent's error while the server keeps answering, and a flood is counted."""
    # The attack has the channel once the agent stops answering (a condition with a deadline,
    # not a fixed sleep: the guest waits a second, then kills or stops its agent).
    deadline = time.monotonic() + 60
    while True:
        try:
            exec_(server, victim, argv=["true"], timeoutS=1)
        except ClientError as exc:
            assert "guest agent" in str(exc), exc
            break
        assert time.monotonic() < deadline, "the agent still answers 60 s after the attack began"
        time.sleep(0.2)
    # One more act goes to the attacked agent while the server is probed: it waits out the reply
    # grace (15 s under TCG) in its own thread, and the probes below show the server answering
    # meanwhile.
    late: dict[str, Any] = {}
    act = threading.Thread(target=lambda: late.update(server.error("rig.act", {
        "rigId": victim, "tool": "terminal_use",
        "action": {"action": "exec", "argv": ["true"], "timeoutS": 1}})), daemon=True)
    act.start()
    # A liveness bound, not a speed target: a wedged event loop never answers; a flooded one
    # under TCG on two shared cores answers late now and then (seen: over 2 s once in CI).
    for _ in range(5):
        took = responsive(server, victim)
        assert took < RESPONSIVE_S, took
        time.sleep(0.2)
    if attack is FLOOD:
        # The flood is counted, however fast a loaded TCG guest manages to send it (a condition
        # with a deadline: once ~950 KB had arrived by the first look).
        deadline = time.monotonic() + 60
        while (channel := server.call("rig.get", {"rigId": victim})["agentChannel"])[
                "garbageBytes"] <= 1_000_000:
            assert time.monotonic() < deadline, channel
            time.sleep(0.5)
    act.join(timeout=120)
    assert not act.is_alive(), "an act on the attacked agent never came back"
    assert "guest agent" in late["message"], late


def test_hostile_agents_leave_server_responsive(server: Server) -> None:
    """Both attacks at once, one victim each (their waits for the agents' reply grace
    overlap), beside a bystander rig that stays untouched."""
    victims = {name: open_terminal(server)["id"] for name in ATTACKS}
    bystander = open_terminal(server)
    for name, attack in ATTACKS.items():
        exec_(server, victims[name], command=attack)
    failed: dict[str, BaseException] = {}

    def run(name: str) -> None:
        try:
            withstand(server, victims[name], ATTACKS[name])
        except BaseException as exc:  # re-raised below, named
            failed[name] = exc

    threads = [threading.Thread(target=run, args=(name,), daemon=True) for name in ATTACKS]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=240)
    assert not any(t.is_alive() for t in threads), "an attack's checks never finished"
    for name, exc in failed.items():
        raise AssertionError(f"{name}: {exc!r}") from exc
    # The other rig is untouched.
    ok = exec_(server, bystander["id"], argv=["echo", "still-fine"])
    assert ok["stdout"]["text"] == "still-fine\n"
    for name, victim in victims.items():
        started = time.monotonic()
        closed = server.call("rig.close", {"rigId": victim})
        assert closed["phase"] == "closed" and time.monotonic() - started < 30, (name, closed)
