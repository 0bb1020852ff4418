"""Guard rules (rigd.guard) over the rig manager and the in-memory fake backend: workspace
settings written by admins and kept across a restart, read-only refusals, ask-first
approvals (allowed, denied, timed out, abandoned), who may answer, and the records left
in the guard log, the rig's action log and the workspace's events."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import trio

from rigd.backends.fake import FakeBackend
from rigd.errors import Conflict, FieldError, Forbidden, NotFound
from rigd.model import Accel, ActionClass, Surface
from rigd.rigs.api import RigApi
from rigd.rigs.events import APPROVAL_DECIDED, APPROVAL_REQUESTED
from rigd.rigs.guard import Guard, Rules, WorkspaceSettings, custom_image, parse_setting, verdict
from rigd.rigs.manager import Caller, RigManager
from rigd.server.methods import build_methods
from rigd.server.rpc import Dispatcher
from rigd.store.aio import Stores
from rigd.tools.catalogue import Tools

pytestmark = pytest.mark.timeout(30)

EXEC = {"action": "exec", "argv": ["echo", "hi"]}
DEFAULTS = {"guard.readOnly": False, "guard.askFirst": [], "rigs.smolvm.execImage": None,
            "rigs.smolvm.browserImage": None, "snapshots.quotaMb": 20480,
            "volumes.quotaMb": 51200}


class World:
    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.stores = Stores(tmp)
        server = self.stores.server
        admin, ws, _ = server.bootstrap()
        self.ws = ws.id
        self.admin = Caller(admin)
        self.agent = Caller(server.create_user("bot", "agent"))
        self.alice = Caller(server.create_user("alice", "person"))
        self.mallory = Caller(server.create_user("mallory", "person"))  # a member of "other" only
        self.other_bot = Caller(server.create_user("otherbot", "agent"))
        for user in (self.agent, self.alice):
            server.add_member(ws.id, user.user.id)
        self.other = server.create_workspace("other").id
        for user in (self.mallory, self.other_bot):
            server.add_member(self.other, user.user.id)
        self.backend = FakeBackend()
        self.rigs = RigManager(self.stores, {s: self.backend for s in (Surface.TERMINAL, Surface.COMPUTER)},
                               accel=Accel.TCG)
        self.api = RigApi(self.rigs)
        self.tools = Tools(self.api)
        self.guard = self.tools.guard

    async def set(self, key: str, value: object, workspace: str = "default") -> dict[str, Any]:
        return await self.guard.set_setting(self.admin, {"workspace": workspace, "key": key, "value": value})

    async def call(self, name: str, arguments: object, caller: Caller | None = None,
                   workspace: str = "default", **extra: Any) -> dict[str, Any]:
        with trio.fail_after(10):
            return await self.tools.call(caller or self.agent, {
                "workspace": workspace, "conversation": "c1", "name": name, "arguments": arguments, **extra})

    async def computer(self) -> str:
        rig = await self.api.call("rig.open", self.admin, {"workspace": "default", "surface": "computer",
                                                           "conversation": "c1"})
        machine = self.backend.machines[-1]
        machine.answers["screenshot"] = {
            "image": {"mediaType": "image/jpeg", "data": "AAAA"}, "display": {"width": 1280, "height": 800},
            "imageSize": {"width": 1280, "height": 800}, "scale": 1.0, "cursor": [1, 2]}
        return str(rig["id"])

    async def rig_log(self, rig_id: str) -> list[tuple[str, str, str, str]]:
        rows = await self.api.call("rig.log", self.admin, {"rigId": rig_id})
        return [(r["tool"], r["verb"], r["outcome"], r["actor"]["id"]) for r in rows if r["verb"] != "open"]

    async def guard_log(self, workspace: str = "default") -> list[dict[str, Any]]:
        reader = self.admin if workspace == "default" else self.mallory  # members read it
        return await self.guard.guard_log(reader, {"workspace": workspace})


@pytest.fixture
async def world(tmp_path: Path) -> AsyncIterator[World]:
    w = World(tmp_path)
    async with trio.open_nursery() as nursery:
        await nursery.start(w.rigs.run)
        yield w
        nursery.cancel_scope.cancel()
    w.stores.close()


async def asked(events: trio.MemoryReceiveChannel[dict[str, Any]]) -> dict[str, Any]:
    """The next ApprovalRequested event of a subscription."""
    with trio.fail_after(5):
        async for event in events:
            if event["type"] == APPROVAL_REQUESTED:
                return event
    raise AssertionError("the subscription ended")


# --- the rules (pure) ----------------------------------------------------------------------


def test_read_only_wins_and_a_tool_without_classes_is_never_held() -> None:
    terminal = (ActionClass.ENCLOSURE_CONTROL, ActionClass.NETWORK_EGRESS, ActionClass.PROCESS_SPAWN)
    both = Rules(read_only=True, ask_first=frozenset({ActionClass.PROCESS_SPAWN}))
    assert verdict(both, terminal).kind == "readOnly"
    assert verdict(both, ()).kind == "allow"
    ask = verdict(Rules(ask_first=frozenset({ActionClass.PROCESS_SPAWN, ActionClass.PACKAGE_INSTALL})), terminal)
    assert (ask.kind, ask.classes) == ("ask", (ActionClass.PROCESS_SPAWN,))
    assert verdict(Rules(ask_first=frozenset({ActionClass.PACKAGE_INSTALL})), terminal).kind == "allow"
    assert verdict(Rules(), terminal).kind == "allow"


# --- settings ------------------------------------------------------------------------------


async def test_settings_default_then_set_normalised_and_reset(world: World) -> None:
    got = await world.guard.get_settings(world.agent, {"workspace": "default"})
    assert got == {"workspace": world.ws, "settings": DEFAULTS, "changed": {}, "ignored": {}}
    assert (await world.set("guard.readOnly", True))["value"] is True
    out = await world.set("guard.askFirst", ["processSpawn", "enclosureControl", "processSpawn"])
    assert out == {"workspace": world.ws, "key": "guard.askFirst",
                   "value": ["enclosureControl", "processSpawn"]}
    got = await world.guard.get_settings(world.alice, {"workspace": world.ws})
    assert got["settings"] == {**DEFAULTS, "guard.readOnly": True,
                               "guard.askFirst": ["enclosureControl", "processSpawn"]}
    assert got["changed"]["guard.readOnly"]["by"] == world.admin.user.id
    assert (await world.set("guard.readOnly", None))["value"] is False  # null: back to the default
    got = await world.guard.get_settings(world.admin, {"workspace": "default"})
    assert got["settings"]["guard.readOnly"] is False and "guard.readOnly" not in got["changed"]
    # Another workspace's settings are its own; a stranger cannot read them.
    assert (await world.guard.get_settings(world.mallory, {"workspace": "other"}))["settings"]["guard.askFirst"] == []
    with pytest.raises(NotFound):
        await world.guard.get_settings(world.mallory, {"workspace": "default"})


@pytest.mark.parametrize(("params", "field"), [
    ({"key": "guard.readonly", "value": True}, "key"),
    ({"key": "rigs.smolvm.execimage", "value": "x"}, "key"),
    ({"key": "rigs.smolvm.execImage", "value": "/var/lib/images/ubuntu"}, "value"),
    ({"key": "rigs.smolvm.execImage", "value": "./ubuntu.tar"}, "value"),
    ({"key": "rigs.smolvm.execImage", "value": "ubuntu.tar.gz"}, "value"),
    ({"key": "rigs.smolvm.execImage", "value": "oci-archive:/tmp/u.tar"}, "value"),
    ({"key": "rigs.smolvm.execImage", "value": "docker://ubuntu"}, "value"),
    ({"key": "rigs.smolvm.execImage", "value": "--privileged"}, "value"),
    ({"key": "rigs.smolvm.execImage", "value": "Ubuntu:24.04"}, "value"),
    ({"key": "rigs.smolvm.execImage", "value": "ubuntu 24.04"}, "value"),
    ({"key": "rigs.smolvm.execImage", "value": 24}, "value"),
    ({"key": "rigs.smolvm.browserImage", "value": "~/chromium"}, "value"),
    ({"key": 3, "value": True}, "key"),
    ({"value": True}, "key"),
    ({"key": "guard.readOnly", "value": "yes"}, "value"),
    ({"key": "guard.readOnly", "value": 1}, "value"),
    ({"key": "guard.readOnly"}, "value"),
    ({"key": "guard.askFirst", "value": "processSpawn"}, "value"),
    ({"key": "guard.askFirst", "value": ["processSpawn", "flying"]}, "value"),
    ({"key": "guard.askFirst", "value": [1]}, "value"),
    ({"key": "guard.askFirst", "value": {"processSpawn": True}}, "value"),
    ({"key": "guard.readOnly", "value": True, "scope": "all"}, "scope"),
])
async def test_bad_keys_and_values_name_the_field(world: World, params: dict[str, Any], field: str) -> None:
    with pytest.raises(FieldError) as exc:
        await world.guard.set_setting(world.admin, {"workspace": "default", **params})
    assert exc.value.field == field
    assert (await world.guard.get_settings(world.admin, {"workspace": "default"}))["changed"] == {}


async def test_only_admins_set_over_rpc_and_settings_survive_a_restart(world: World) -> None:
    rpc = Dispatcher(build_methods(world.stores, world.rigs, None, []))

    async def ask(caller: Caller, method: str, params: dict[str, Any]) -> dict[str, Any]:
        reply = await rpc.handle(caller, {"jsonrpc": "2.0", "id": 1, "method": method, "params": params})
        assert reply is not None
        return reply

    set_ro = {"workspace": "default", "key": "guard.readOnly", "value": True}
    for caller in (world.agent, world.alice):
        reply = await ask(caller, "workspace.settings.set", set_ro)
        assert reply["error"]["code"] == Forbidden.code, reply
    with pytest.raises(Forbidden):  # the guard does not rely on the RPC table alone
        await world.guard.set_setting(world.alice, set_ro)
    assert (await ask(world.admin, "workspace.settings.set", set_ro))["result"]["value"] is True
    # An admin sets a workspace it is not a member of.
    reply = await ask(world.admin, "workspace.settings.set", {"workspace": "other", "key": "guard.askFirst",
                                                              "value": ["networkEgress"]})
    assert reply["result"]["value"] == ["networkEgress"]
    reply = await ask(world.alice, "workspace.settings.get", {"workspace": "default"})
    assert reply["result"]["settings"]["guard.readOnly"] is True
    assert (await world.call("terminal_use", EXEC))["isError"] is True

    # A new store and guard over the same data directory (a restarted server) still know.
    world.stores.close()
    stores = Stores(world.tmp)
    try:
        guard = Guard(stores, world.rigs.events)
        got = await guard.get_settings(world.admin, {"workspace": "default"})
        assert got["settings"] == {**DEFAULTS, "guard.readOnly": True}
        got = await guard.get_settings(world.mallory, {"workspace": "other"})
        assert got["settings"]["guard.askFirst"] == ["networkEgress"]
        rows = await guard.guard_log(world.admin, {"workspace": "default"})
        assert [r["decision"] for r in rows] == ["readOnly"]
    finally:
        stores.close()
        world.stores = Stores(world.tmp)  # for the fixture's teardown


# --- read-only -----------------------------------------------------------------------------


async def test_read_only_refuses_every_tool_with_a_class_and_records_it(world: World) -> None:
    rig_id = await world.computer()
    machines = len(world.backend.machines)
    await world.set("guard.readOnly", True)
    out = await world.call("terminal_use", EXEC)
    assert out["isError"] is True
    text = out["content"][0]["text"]
    assert "read-only" in text and "terminal_use" in text and "processSpawn" in text
    assert out["error_data"]["guard"] == "readOnly"
    assert len(world.backend.machines) == machines  # no terminal was opened
    for name, args, dialect in (("computer_use", {"action": "screenshot", "rigId": rig_id}, "openai"),
                                ("rig_close", {"rigId": rig_id}, "openai"),
                                ("computer", {"action": "screenshot", "rigId": rig_id}, "anthropic")):
        refused = await world.call(name, args, dialect=dialect)
        assert refused["isError"] is True and "read-only" in refused["content"][0]["text"], name
    assert (await world.api.call("rig.get", world.admin, {"rigId": rig_id}))["phase"] == "ready"
    listed = await world.call("rig_list", {})
    assert listed["isError"] is False and rig_id in listed["content"][0]["text"]
    rows = await world.guard_log()
    assert [(r["tool"], r["decision"], r["rigId"]) for r in rows] == [
        ("terminal_use", "readOnly", None), ("computer_use", "readOnly", rig_id),
        ("rig_close", "readOnly", rig_id), ("computer", "readOnly", rig_id)]
    assert rows[0]["requestedBy"] == {"kind": "agent", "id": world.agent.user.id}
    assert rows[0]["args"] == {"action": "exec", "argv": ["echo", "hi"]}
    # The rig's own log says it too, and no screenshot ran.
    assert await world.rig_log(rig_id) == [("guard", "readOnly", "refused", world.agent.user.id)] * 3
    # Another workspace is not read-only.
    assert (await world.call("rig_list", {}, caller=world.other_bot, workspace="other"))["isError"] is False
    ran = await world.call("terminal_use", EXEC, caller=world.other_bot, workspace="other")
    assert ran["isError"] is False, ran


async def test_a_strangers_rig_id_is_not_echoed_in_the_record(world: World) -> None:
    rig_id = await world.computer()
    await world.set("guard.readOnly", True, workspace="other")
    out = await world.call("computer_use", {"action": "screenshot", "rigId": rig_id}, caller=world.other_bot,
                           workspace="other")
    assert out["isError"] is True
    assert [r["rigId"] for r in await world.guard_log("other")] == [None]
    assert await world.rig_log(rig_id) == []


# --- ask-first -----------------------------------------------------------------------------


async def test_ask_first_waits_for_a_person_who_allows(world: World) -> None:
    rig_id = await world.computer()
    await world.set("guard.askFirst", ["processSpawn"])
    events = world.rigs.events.subscribe(world.ws)
    results: list[dict[str, Any]] = []
    async with trio.open_nursery() as nursery:
        async def run() -> None:
            results.append(await world.call("computer_use", {"action": "screenshot", "rigId": rig_id}))
        nursery.start_soon(run)
        event = await asked(events)
        assert event["rigId"] == rig_id and event["tool"] == "computer_use"
        assert event["classes"] == ["processSpawn"] and event["requestedBy"]["name"] == "bot"
        listed = await world.guard.list_approvals(world.alice, {"workspace": "default"})
        assert [a["approvalId"] for a in listed] == [event["approvalId"]]
        assert listed[0]["rigId"] == rig_id and listed[0]["args"] == {"action": "screenshot"}
        assert world.backend.machines[-1].performed == []  # it waits
        assert results == []
        decided = await world.guard.decide(world.alice, {"approvalId": event["approvalId"], "allow": True})
        assert decided["decision"] == "allowed" and decided["decidedBy"]["name"] == "alice"
    out = results[0]
    assert out["isError"] is False and out["content"][0]["type"] == "image"
    assert "approved by alice" in out["content"][-1]["text"]
    assert out["approval"] == {"approvalId": event["approvalId"], "decision": "allowed",
                               "decidedBy": {"id": world.alice.user.id, "name": "alice", "kind": "person"}}
    assert await world.guard.list_approvals(world.alice, {"workspace": "default"}) == []
    # The decision is on record before the action, by the person who made it.
    assert await world.rig_log(rig_id) == [("guard", "allowed", "ok", world.alice.user.id),
                                           ("computer_use", "screenshot", "ok", world.agent.user.id)]
    [row] = await world.guard_log()
    assert row["decision"] == "allowed" and row["approvalId"] == event["approvalId"]
    assert row["decidedBy"] == {"kind": "person", "id": world.alice.user.id}
    assert [e["type"] for e in await world.api.call("rig.events", world.admin, {"workspace": "default"})
            if e["type"].startswith("Approval")] == [APPROVAL_REQUESTED, APPROVAL_DECIDED]


async def test_ask_first_denial_is_a_readable_error_and_nothing_runs(world: World) -> None:
    await world.set("guard.askFirst", ["networkEgress"])
    events = world.rigs.events.subscribe(world.ws)
    results: list[dict[str, Any]] = []
    async with trio.open_nursery() as nursery:
        async def run() -> None:
            results.append(await world.call("terminal_use", EXEC))
        nursery.start_soon(run)
        event = await asked(events)
        assert event["rigId"] == ""  # the conversation's terminal does not exist yet
        await world.guard.decide(world.admin, {"approvalId": event["approvalId"], "allow": False})
    out = results[0]
    assert out["isError"] is True
    assert "admin (a person) denied this terminal_use call" in out["content"][0]["text"]
    assert out["approval"]["decision"] == "denied" and out["approval"]["decidedBy"]["name"] == "admin"
    assert world.backend.machines == []  # no terminal was opened
    [row] = await world.guard_log()
    assert (row["decision"], row["tool"], row["classes"]) == ("denied", "terminal_use", ["networkEgress"])
    with pytest.raises(NotFound):  # answered: it is gone
        await world.guard.decide(world.alice, {"approvalId": event["approvalId"], "allow": True})


async def test_ask_first_times_out_when_nobody_answers(world: World) -> None:
    await world.set("guard.askFirst", ["enclosureControl"])
    started = trio.current_time()
    out = await world.call("terminal_use", EXEC, approvalTimeoutS=0.3)
    assert 0.3 <= trio.current_time() - started < 5
    assert out["isError"] is True and "nobody answered" in out["content"][0]["text"]
    assert out["approval"]["decision"] == "timedOut" and out["approval"]["decidedBy"] is None
    assert world.backend.machines == []
    [row] = await world.guard_log()
    assert row["decision"] == "timedOut" and row["decidedBy"] is None and row["waitedMs"] >= 300
    assert await world.guard.list_approvals(world.admin, {"workspace": "default"}) == []
    with pytest.raises(NotFound):
        await world.guard.decide(world.alice, {"approvalId": row["approvalId"], "allow": True})


async def test_a_call_that_goes_away_drops_its_approval_and_says_so(world: World) -> None:
    await world.set("guard.askFirst", ["processSpawn"])
    events = world.rigs.events.subscribe(world.ws)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(world.call, "terminal_use", EXEC)
        event = await asked(events)
        nursery.cancel_scope.cancel()
    assert await world.guard.list_approvals(world.alice, {"workspace": "default"}) == []
    assert [r["decision"] for r in await world.guard_log()] == ["cancelled"]
    with pytest.raises(NotFound):
        await world.guard.decide(world.alice, {"approvalId": event["approvalId"], "allow": True})


async def test_who_may_answer_and_another_workspaces_approval_is_not_found(world: World) -> None:
    rig_id = await world.computer()
    await world.set("guard.askFirst", ["processSpawn"])
    events = world.rigs.events.subscribe(world.ws)
    results: list[dict[str, Any]] = []
    async with trio.open_nursery() as nursery:
        async def run(caller: Caller) -> None:
            results.append(await world.call("computer_use", {"action": "screenshot", "rigId": rig_id},
                                            caller=caller))
        nursery.start_soon(run, world.alice)  # a person's own call
        event = await asked(events)
        approval = event["approvalId"]
        with pytest.raises(Forbidden):  # the caller that asked cannot approve itself
            await world.guard.decide(world.alice, {"approvalId": approval, "allow": True})
        with pytest.raises(Forbidden):  # an agent of the workspace cannot answer
            await world.guard.decide(world.agent, {"approvalId": approval, "allow": True})
        with pytest.raises(NotFound) as missing:  # a person of another workspace: not found
            await world.guard.decide(world.mallory, {"approvalId": approval, "allow": True})
        assert missing.value.data["field"] == "approvalId"
        assert await world.guard.list_approvals(world.mallory, {"workspace": "other"}) == []
        with pytest.raises(NotFound):
            await world.guard.list_approvals(world.mallory, {"workspace": "default"})
        assert len(await world.guard.list_approvals(world.agent, {"workspace": "default"})) == 1
        await world.guard.decide(world.admin, {"approvalId": approval, "allow": True})
    assert results[0]["isError"] is False
    assert results[0]["approval"]["decidedBy"]["name"] == "admin"


async def test_a_settled_approval_refuses_a_second_answer(world: World) -> None:
    await world.set("guard.askFirst", ["processSpawn"])
    events = world.rigs.events.subscribe(world.ws)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(world.call, "terminal_use", EXEC)
        event = await asked(events)
        approval = event["approvalId"]
        # Two answers in one scheduling step: the first wins, the second is told.
        async with trio.open_nursery() as answers:
            outcomes: list[str] = []

            async def answer(caller: Caller, allow: bool) -> None:
                try:
                    outcomes.append((await world.guard.decide(caller, {"approvalId": approval,
                                                                       "allow": allow}))["decision"])
                except (Conflict, NotFound) as exc:
                    outcomes.append(type(exc).__name__)
            answers.start_soon(answer, world.alice, False)
            answers.start_soon(answer, world.admin, True)
    won = [o for o in outcomes if o in ("allowed", "denied")]
    assert len(won) == 1 and len(outcomes) == 2
    assert next(o for o in outcomes if o not in won) in ("Conflict", "NotFound")  # settled, or gone
    assert [r["decision"] for r in await world.guard_log()] == won


@pytest.mark.parametrize(("params", "field"), [
    ({"approvalId": "apr_x"}, "allow"),
    ({"approvalId": "apr_x", "allow": "yes"}, "allow"),
    ({"allow": True}, "approvalId"),
    ({"approvalId": "no spaces", "allow": True}, "approvalId"),
    ({"approvalId": "apr_x", "allow": True, "reason": "x"}, "reason"),
])
async def test_bad_decide_params_name_the_field(world: World, params: dict[str, Any], field: str) -> None:
    with pytest.raises(FieldError) as exc:
        await world.guard.decide(world.alice, params)
    assert exc.value.field == field


@pytest.mark.parametrize("timeout", [0, -1, 3601, "10", True, float("nan")])
async def test_a_bad_approval_timeout_is_refused(world: World, timeout: object) -> None:
    with pytest.raises(FieldError) as exc:
        await world.call("rig_list", {}, approvalTimeoutS=timeout)
    assert exc.value.field == "approvalTimeoutS"


async def test_an_unknown_approval_is_not_found(world: World) -> None:
    with pytest.raises(NotFound):
        await world.guard.decide(world.alice, {"approvalId": "apr_0123", "allow": True})


async def test_the_rpc_table_serves_one_guard_to_tools_call_and_approvals(world: World) -> None:
    rpc = Dispatcher(build_methods(world.stores, world.rigs, None, []))

    async def ask(caller: Caller, method: str, params: dict[str, Any]) -> Any:
        reply = await rpc.handle(caller, {"jsonrpc": "2.0", "id": 1, "method": method, "params": params})
        assert reply is not None and "result" in reply, reply
        return reply["result"]

    await ask(world.admin, "workspace.settings.set", {"workspace": "default", "key": "guard.askFirst",
                                                      "value": ["processSpawn"]})
    results: list[dict[str, Any]] = []
    async with trio.open_nursery() as nursery:
        async def run() -> None:
            results.append(await ask(world.agent, "tools.call", {
                "workspace": "default", "conversation": "c9", "name": "terminal_use",
                "arguments": '{"action": "exec", "argv": ["echo", "via rpc"]}', "approvalTimeoutS": 20}))
        nursery.start_soon(run)
        with trio.fail_after(5):
            while not (waiting := await ask(world.alice, "approval.list", {"workspace": world.ws})):
                await trio.sleep(0.01)
        assert [w["tool"] for w in waiting] == ["terminal_use"]
        decided = await ask(world.alice, "approval.decide", {"approvalId": waiting[0]["approvalId"],
                                                             "allow": True})
        assert decided["decision"] == "allowed"
    out = results[0]
    assert out["isError"] is False and "via rpc" in out["content"][0]["text"], out
    [row] = await ask(world.alice, "guard.log", {"workspace": "default"})
    assert row["decision"] == "allowed" and row["conversation"] == "c9"
    assert world.backend.machines[-1].calls == [["echo", "via rpc"]]


# --- custom images per workspace --------------------------------------------------------------


async def test_an_exec_image_is_normalised_and_new_terminals_boot_it(world: World) -> None:
    world.rigs.settings_of = world.guard.settings
    out = await world.set("rigs.smolvm.execImage", "ubuntu:24.04")
    assert out["value"] == "docker.io/library/ubuntu:24.04"
    out = await world.set("rigs.smolvm.execImage", "127.0.0.1:5000/team/runner@sha256:" + "ab" * 32)
    assert out["value"] == "127.0.0.1:5000/team/runner@sha256:" + "ab" * 32
    rig = await world.api.call("rig.open", world.admin, {"workspace": "default", "surface": "terminal",
                                                         "wait": True})
    assert world.backend.machines[-1].spec.image == out["value"]
    assert rig["imageRef"] == out["value"] and not any("execImage" in n for n in rig["notes"])
    # A computer rig is not a terminal: the setting does not touch it; another workspace boots its own.
    await world.api.call("rig.open", world.admin, {"workspace": "default", "surface": "computer"})
    assert world.backend.machines[-1].spec.image is None
    await world.api.call("rig.open", world.mallory, {"workspace": "other", "surface": "terminal"})
    assert world.backend.machines[-1].spec.image is None


async def test_a_bad_value_planted_in_the_store_is_ignored_visibly(world: World) -> None:
    world.rigs.settings_of = world.guard.settings
    # Not through workspace.settings.set (which refuses it): written straight into server.db.
    world.stores.server.set_workspace_setting(world.ws, "rigs.smolvm.execImage",
                                              json.dumps("/home/me/ubuntu.qcow2"), world.admin.user.id)
    got = await world.guard.get_settings(world.admin, {"workspace": "default"})
    assert got["settings"]["rigs.smolvm.execImage"] is None
    assert "/home/me/ubuntu.qcow2" in got["ignored"]["rigs.smolvm.execImage"]
    assert "local path" in got["ignored"]["rigs.smolvm.execImage"]
    rig = await world.api.call("rig.open", world.admin, {"workspace": "default", "surface": "terminal",
                                                         "wait": True})
    assert rig["phase"] == "ready" and rig["imageRef"] is None
    assert world.backend.machines[-1].spec.image is None
    note = next(n for n in rig["notes"] if "execImage" in n)
    assert "local path" in note and "the built-in image boots" in note
    again = await world.api.call("rig.get", world.admin, {"rigId": rig["id"]})
    assert note in again["notes"]  # kept with the rig, not only in the open's answer


def test_custom_image_checks_again_at_boot_and_says_what_the_browser_key_does() -> None:
    def settings(**values: object) -> WorkspaceSettings:
        return WorkspaceSettings({**DEFAULTS, **values}, {})

    assert custom_image(settings(), "terminal", None) == (None, None)
    ref = "127.0.0.1:5000/t/u:1"
    assert custom_image(settings(**{"rigs.smolvm.execImage": ref}), "terminal", None) == (ref, None)
    # A value that got into the settings without the field's check is refused again here.
    got, note = custom_image(settings(**{"rigs.smolvm.execImage": "--rm"}), "terminal", None)
    assert got is None and note is not None and "'-'" in note and "built-in image boots" in note
    assert custom_image(settings(**{"rigs.smolvm.execImage": ref}), "computer", None) == (None, None)
    browser = settings(**{"rigs.smolvm.browserImage": ref})
    got, note = custom_image(browser, "browser", "firefox")
    assert got is None and note is not None and "Chromium rigs only" in note
    assert custom_image(browser, "browser", "chromium") == (ref, None)
    assert custom_image(browser, "terminal", None) == (None, None)  # each surface its own key


@pytest.mark.parametrize("value", [-1, 1.5, "20", True, 16 * 1024 * 1024 + 1])
def test_the_snapshot_quota_is_a_bounded_whole_number_of_mb(value: object) -> None:
    with pytest.raises(FieldError) as exc:
        parse_setting("snapshots.quotaMb", value)
    assert exc.value.field == "value"
    assert parse_setting("snapshots.quotaMb", 0)[1] == 0
