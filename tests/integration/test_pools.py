"""Pools through a real server (issue 28): terminal rigs booted before anyone asks, under TCG.

One server for the module, started with ``--pool terminal=2``; the tests run in file order
and reshape its pools with ``server.configure`` as they go. What is checked is what a
caller notices: an open answered by a pooled rig at once (``start: "pool"``), two opens at
once getting two machines of their own (machine-id, boot id, the kernel's random bytes),
the pool refilling behind them, pooled rigs giving way first to a rig that needs the
memory, pools of size 0 opening as before, and a pool whose image cannot be built saying
why in ``server.info``. (Browser pools — the caller's allowlist and profile in a taken
engine, the page's own random values — are in test_browser_rig.py, beside the rig they share
an image and a standby snapshot with.)
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rigd.images.cache import default_cache_dir
from tests.integration.conftest import REPO, Server, make_data_dir, remove_tree, serving

pytestmark = [
    pytest.mark.vm,
    pytest.mark.timeout(300),
    pytest.mark.skipif(shutil.which("qemu-system-x86_64") is None, reason="needs QEMU"),
]


def pools(srv: Server) -> dict[str, dict[str, Any]]:
    return {p["key"]: p for p in srv.call("server.info")["pools"]}


def wait_pool(srv: Server, key: str, ready: int, within_s: float = 120) -> dict[str, Any]:
    """Wait until the pool ``key`` has ``ready`` rigs ready and none starting."""
    deadline = time.monotonic() + within_s
    while True:
        got = pools(srv).get(key, {})
        if got.get("ready") == ready and not got.get("filling"):
            return got
        assert time.monotonic() < deadline, f"the {key} pool never had {ready} ready: {got}"
        time.sleep(0.2)


def sh(srv: Server, rig: str, command: str) -> str:
    out = srv.call("rig.act", {"rigId": rig, "tool": "terminal_use",
                               "action": {"action": "exec", "command": command}})
    assert out["exitCode"] == 0, out
    return str(out["stdout"]["text"]).strip()


def open_terminal(srv: Server, **params: Any) -> dict[str, Any]:
    return dict(srv.call("rig.open", {"workspace": "default", "surface": "terminal", **params}))


@pytest.fixture(scope="module")
def srv() -> Iterator[Server]:
    with serving(make_data_dir(), "--pool", "terminal=2") as server:
        yield server


def test_an_open_takes_a_pooled_rig_at_once_and_the_pool_refills(srv: Server) -> None:
    # Nothing is asked for yet, and the pool already holds two ready machines no caller sees.
    wait_pool(srv, "terminal", 2)
    assert srv.call("rig.list", {"workspace": "default"}) == []
    t0 = time.monotonic()
    rig = open_terminal(srv, conversation="first")
    took = time.monotonic() - t0
    print(f"pool hit: rig.open answered in {took:.2f} s")
    assert rig["start"] == "pool" and rig["phase"] == "ready" and rig["phaseDetail"] == "ready (taken from its pool)"
    assert rig["conversation"] == "first" and rig["notes"][1:] == [], rig["notes"]
    assert sh(srv, rig["id"], "echo taken") == "taken"
    # Its log opens with the caller's open; nothing from its time in the pool.
    log = srv.call("rig.log", {"rigId": rig["id"]})
    assert log[0]["seq"] == 1 and log[0]["verb"] == "open" and log[0]["args"]["start"] == "pool", log[0]
    # The pool refills behind it, with a machine of its own.
    info = wait_pool(srv, "terminal", 2)
    assert info["taken"] >= 1 and info["error"] is None
    srv.call("rig.close", {"rigId": rig["id"]})


def _open_into(srv: Server, out: list[dict[str, Any]], conversation: str) -> None:
    out.append(open_terminal(srv, conversation=conversation))


def test_two_opens_at_once_get_two_machines_of_their_own(srv: Server) -> None:
    wait_pool(srv, "terminal", 2)
    got: list[dict[str, Any]] = []
    threads = [threading.Thread(target=_open_into, args=(srv, got, f"at-once-{i}")) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(got) == 2 and {r["start"] for r in got} == {"pool"}, got
    a, b = (r["id"] for r in got)
    assert a != b
    # Each booted on its own: machine-id, boot id and the kernel's random bytes are its own.
    probe = "cat /etc/machine-id /proc/sys/kernel/random/boot_id; head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \\n'"
    seen = [sh(srv, rig, probe).split() for rig in (a, b)]
    for i, what in enumerate(("machine-id", "boot id", "random bytes")):
        assert seen[0][i] != seen[1][i], (what, seen)
    for rig in (a, b):
        srv.call("rig.close", {"rigId": rig})


def test_a_request_the_pool_cannot_serve_opens_afresh_saying_why(srv: Server) -> None:
    wait_pool(srv, "terminal", 2)
    rig = open_terminal(srv, memoryMb=768)
    assert rig["start"] in ("warm", "cold")
    assert any(n.startswith("not from the terminal pool: 768 MB was asked for") for n in rig["notes"]), rig["notes"]
    assert pools(srv)["terminal"]["ready"] == 2  # the pooled rigs were left alone
    srv.call("rig.close", {"rigId": rig["id"]})


def test_pooled_rigs_give_way_first_to_a_rig_that_needs_the_memory(srv: Server) -> None:
    wait_pool(srv, "terminal", 2)
    mine = open_terminal(srv, conversation="kept")  # a pooled rig, now the caller's
    wait_pool(srv, "terminal", 2)
    info = srv.call("server.info")
    budget = info["memoryBudgetMb"]
    evicted = pools(srv)["terminal"]["evicted"]
    try:
        # 50 MB short of room for a 1024 MB rig: one rig must give way, and a pooled one goes
        # (a pooled rig is resident in well over 50 MB), not the caller's older one.
        srv.call("server.configure", {"memoryBudgetMb": max(info["memoryInUseMb"] + 1024 - 50, 1024)})
        big = open_terminal(srv, memoryMb=1024, conversation="big")
        assert big["start"] in ("warm", "cold")
        assert srv.call("rig.get", {"rigId": mine["id"]})["phase"] == "ready"
        deadline = time.monotonic() + 30
        while pools(srv)["terminal"]["evicted"] != evicted + 1:
            assert time.monotonic() < deadline, pools(srv)
            time.sleep(0.2)
        srv.call("rig.close", {"rigId": big["id"]})
    finally:
        srv.call("server.configure", {"memoryBudgetMb": budget})
    srv.call("rig.close", {"rigId": mine["id"]})
    wait_pool(srv, "terminal", 2)


def test_bad_pool_settings_are_refused_naming_the_field_and_nothing_changes(srv: Server) -> None:
    before = pools(srv)
    for params, field in (({"pools": {"terminal": -1}}, "pools.terminal"),
                          ({"pools": {"phone": 1}}, "pools.phone"),
                          ({"pools": ["terminal"]}, "pools"),
                          ({"pools": {"terminal": 1, "computer": 4}}, "pools"),
                          ({"poolMaxAgeS": 5}, "poolMaxAgeS")):
        err = srv.error("server.configure", params)
        assert err["data"]["field"] == field, (params, err)
    assert {k: v["size"] for k, v in pools(srv).items()} == {k: v["size"] for k, v in before.items()}
    # And on the command line: the server does not start, naming the flag.
    data_dir = make_data_dir()
    try:
        out = subprocess.run([sys.executable, "-m", "rigd", "serve", "--data-dir", str(data_dir),
                              "--port", "0", "--accel", "tcg", "--pool", "terminal=lots"],
                             capture_output=True, text=True, timeout=60, cwd=REPO)
    finally:
        remove_tree(data_dir)
    assert out.returncode == 2 and "--pool" in out.stderr, out.stderr


def test_a_pool_of_size_zero_opens_as_before(srv: Server) -> None:
    srv.call("server.configure", {"pools": {"terminal": 0}})
    deadline = time.monotonic() + 60
    while "terminal" in pools(srv):  # the pooled rigs are retired
        assert time.monotonic() < deadline, pools(srv)
        time.sleep(0.2)
    rig = open_terminal(srv)
    assert rig["start"] in ("warm", "cold") and not any("pool" in n for n in rig["notes"]), rig
    assert sh(srv, rig["id"], "echo fine") == "fine"
    srv.call("rig.close", {"rigId": rig["id"]})


def test_a_pool_whose_image_cannot_be_built_says_why(tmp_path: Path) -> None:
    """The WebKit image cannot be built here (its cache directory is a file in this server's
    cache, whose terminal assets are the real ones): the pool says so, and the server serves on."""
    real = default_cache_dir()
    cache = tmp_path / "cache"
    cache.mkdir()
    for name in os.listdir(real):
        if name != "browser-webkit2gtk-driver":
            (cache / name).symlink_to(real / name)
    (cache / "browser-webkit2gtk-driver").write_text("not a directory\n")
    with serving(make_data_dir(), "--pool", "browser:webkit=1", "--cache-dir", str(cache)) as server:
        deadline = time.monotonic() + 120
        while True:
            got = pools(server).get("browser:webkit", {})
            if got.get("error"):
                break
            assert time.monotonic() < deadline, got
            time.sleep(0.2)
        print(f"the pool says: {got['error']}")
        assert got["ready"] == 0 and "browser-webkit2gtk-driver" in got["error"], got
        assert got["retryInS"] > 0
        assert server.call("rig.list", {"workspace": "default"}) == []
