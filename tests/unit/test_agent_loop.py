"""``rigd agent`` without sockets: the loop against a scripted model and a fake rigd RPC --
what the model is sent (tools, tool results, screenshots as image parts, older ones dropped),
when it stops, what it closes -- and the SDK adapter over an in-memory HTTP transport."""

from __future__ import annotations

import base64
import copy
import io
import json
import os
import signal
import threading
from collections.abc import Callable
from typing import Any

import httpx2
import openai
import pytest
import trio
from PIL import Image

from rigd.client import cli
from rigd.client.agent import (
    DROPPED_IMAGE,
    Agent,
    AgentError,
    Message,
    ModelError,
    OpenAIModel,
    Reply,
    ReplyError,
    Stop,
    ToolCall,
    count_images,
    drop_old_images,
    parse_call_result,
    parse_tool_list,
    printable,
    run_interruptible,
)
from rigd.client.cli import ClientError
from rigd.tools.catalogue import definitions, metadata, render_computer, text_result

pytestmark = pytest.mark.timeout(30)

TOOL_NAMES = ["rig_list", "rig_close", "terminal_use", "computer_use", "browser_use"]


def png(shade: int) -> str:
    buf = io.BytesIO()
    Image.new("RGB", (4, 3), (shade, 10, 10)).save(buf, "PNG")
    return base64.b64encode(buf.getvalue()).decode()


def screenshot(shade: int) -> dict[str, Any]:
    return render_computer("screenshot", {
        "image": {"data": png(shade), "mediaType": "image/png"}, "display": {"width": 1280, "height": 800},
        "imageSize": {"width": 4, "height": 3}, "scale": 320.0})


def call(name: str, args: Any = None, *, raw: str | None = None, n: int = 0) -> ToolCall:
    return ToolCall(f"call_{name}_{n}", name, raw if raw is not None else json.dumps(args or {}))


class FakeModel:
    """A scripted model: each request gets the next reply (or raises it); every request's
    history is kept as it was sent."""

    def __init__(self, script: list[Reply | Exception] | Callable[[int], Reply]) -> None:
        self.script = script
        self.sent: list[list[Message]] = []
        self.tools: list[list[str]] = []

    def __call__(self, messages: list[Message], tools: list[dict[str, Any]]) -> Reply:
        self.sent.append(copy.deepcopy(messages))
        self.tools.append([t["function"]["name"] for t in tools])
        if callable(self.script):
            return self.script(len(self.sent))
        reply = self.script[len(self.sent) - 1]
        if isinstance(reply, Exception):
            raise reply
        return reply


class FakeRigd:
    """A blocking RPC like :meth:`rigd.client.cli.Client.call`: ``tools.list`` from the real definitions,
    ``rig.list``/``rig.close`` over a table of rigs; ``terminal_use`` opens the conversation's
    terminal as the server does; ``computer_use`` answers screenshots."""

    def __init__(self, rigs: list[dict[str, Any]] | None = None) -> None:
        self.rigs: list[dict[str, Any]] = list(rigs or [])
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.shots = 0
        self.tool_reply: Callable[[dict[str, Any]], Any] | None = None

    def __call__(self, method: str, params: dict[str, Any]) -> Any:
        self.calls.append((method, params))
        if method == "tools.list":
            return {"tools": definitions(), "metadata": metadata()}
        if method == "rig.list":
            return [dict(r) for r in self.rigs if r["phase"] != "closed"]
        if method == "rig.close":
            rig = next((r for r in self.rigs if r["id"] == params["rigId"]), None)
            if rig is None:
                raise ClientError(f"no rig {params['rigId']!r}")
            rig["phase"] = "closed"
            return rig
        if method == "seat.release":
            return {"name": params["name"], "holder": None}
        if method == "tools.call":
            if self.tool_reply is not None:
                return self.tool_reply(params)
            if params["name"] == "rig_list":
                return text_result(", ".join(r["id"] for r in self.rigs if r["phase"] != "closed"))
            if params["name"] == "terminal_use":
                rig = self.open(params["conversation"], "terminal")
                return text_result("exit code: 0\nhello", rigId=rig["id"])
            if params["name"] == "computer_use":
                rig = self.open(params["conversation"], "computer")
                self.shots += 1
                return {**screenshot(self.shots), "rigId": rig["id"]}
        raise AssertionError(f"unexpected call {method} {params}")

    def open(self, conversation: str, surface: str) -> dict[str, Any]:
        for rig in self.rigs:
            if rig["conversation"] == conversation and rig["surface"] == surface and rig["phase"] != "closed":
                return rig
        rig = {"id": f"rig_{surface}{len(self.rigs)}", "surface": surface, "phase": "ready",
               "conversation": conversation}
        self.rigs.append(rig)
        return rig

    def methods(self, name: str) -> list[dict[str, Any]]:
        return [p for m, p in self.calls if m == name]


def agent(model: FakeModel, rigd: FakeRigd, lines: list[str], **kw: Any) -> Agent:
    return Agent(model, rigd, workspace="ws-1", conversation="conv-1", out=lines.append, **kw)


def tool_messages(messages: list[Message]) -> list[Message]:
    return [m for m in messages if m["role"] == "tool"]


# -- the loop -------------------------------------------------------------------------------------


async def test_a_tool_call_then_a_final_answer() -> None:
    model = FakeModel([Reply("Let me look.", (call("terminal_use", {"action": "exec", "command": "echo hi"}),)),
                       Reply("The machine says hello.")])
    rigd, lines = FakeRigd(), []
    outcome = await agent(model, rigd, lines).run("say hi")

    assert outcome.stop is Stop.ANSWER and outcome.steps == 2 and outcome.answer == "The machine says hello."
    assert outcome.stop.exit_code == 0
    # The model got the server's tools and, on its second request, the tool's result.
    assert model.tools[0] == TOOL_NAMES
    first = model.sent[0]
    assert [m["role"] for m in first] == ["system", "user"] and first[1]["content"] == "say hi"
    second = model.sent[1]
    assert [m["role"] for m in second] == ["system", "user", "assistant", "tool"]
    assert second[2]["tool_calls"][0]["function"] == {
        "name": "terminal_use", "arguments": '{"action": "exec", "command": "echo hi"}'}
    assert second[3] == {"role": "tool", "tool_call_id": "call_terminal_use_0", "content": "exit code: 0\nhello"}
    # The call went to tools.call for this workspace and conversation, arguments parsed.
    assert rigd.methods("tools.call") == [{"workspace": "ws-1", "conversation": "conv-1", "name": "terminal_use",
                                           "arguments": {"action": "exec", "command": "echo hi"}}]
    # Each step printed: the model's text, the call, a one-line result.
    assert "[1] Let me look." in lines
    assert '[1] → terminal_use {"action": "exec", "command": "echo hi"}' in lines
    assert "[1] ← ok: exit code: 0 hello" in lines
    assert "[2] The machine says hello." in lines and "[2] done: the model answered" in lines


async def test_screenshots_go_as_image_parts_and_only_the_newest_two_stay() -> None:
    shot = call("computer_use", {"action": "screenshot"})
    model = FakeModel([Reply(None, (shot,)), Reply(None, (shot,)), Reply(None, (shot,)), Reply("seen")])
    rigd, lines = FakeRigd(), []
    outcome = await agent(model, rigd, lines).run("look at the screen")
    assert outcome.stop is Stop.ANSWER

    # After the first step: the tool message is text (the scale note), the image follows in a user message.
    after_one = model.sent[1]
    tool, images = after_one[-2], after_one[-1]
    assert tool["role"] == "tool" and isinstance(tool["content"], str)
    assert "display 1280x800" in tool["content"] and "attached to the next user message" in tool["content"]
    assert images["role"] == "user"
    urls = [p["image_url"]["url"] for p in images["content"] if p["type"] == "image_url"]
    assert urls == [f"data:image/png;base64,{png(1)}"]

    # The fourth request carries three screenshots' worth of history but only the newest two images.
    last = model.sent[3]
    assert count_images(last) == 2
    kept = [p["image_url"]["url"] for m in last if isinstance(m["content"], list)
            for p in m["content"] if p["type"] == "image_url"]
    assert kept == [f"data:image/png;base64,{png(2)}", f"data:image/png;base64,{png(3)}"]
    assert sum(1 for m in last if isinstance(m["content"], list)
               for p in m["content"] if p == {"type": "text", "text": DROPPED_IMAGE}) == 1
    # Tool messages always directly follow their assistant message (the API's rule).
    for i, m in enumerate(last):
        if m["role"] == "tool":
            assert last[i - 1]["role"] == "assistant"
    assert "[1] ← ok: [1 image] Screenshot: display 1280x800, image 4x3, scale 320.0 " \
           "(display pixels per image pixel)." in lines


async def test_keep_images_one_keeps_only_the_newest() -> None:
    shot = call("computer_use", {"action": "screenshot"})
    model = FakeModel([Reply(None, (shot,)), Reply(None, (shot,)), Reply("ok")])
    await agent(model, FakeRigd(), [], keep_images=1).run("t")
    assert count_images(model.sent[2]) == 1
    assert png(2) in json.dumps(model.sent[2]) and png(1) not in json.dumps(model.sent[2])


def test_drop_old_images_counts_from_the_newest() -> None:
    def img(n: int) -> dict[str, Any]:
        return {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{n}"}}

    messages: list[Message] = [
        {"role": "user", "content": "task"},
        {"role": "user", "content": [{"type": "text", "text": "a"}, img(1), img(2)]},
        {"role": "tool", "tool_call_id": "x", "content": "text only"},
        {"role": "user", "content": [img(3)]},
    ]
    assert drop_old_images(messages, 2) == 1
    assert messages[1]["content"] == [{"type": "text", "text": "a"}, {"type": "text", "text": DROPPED_IMAGE}, img(2)]
    assert messages[3]["content"] == [img(3)]
    assert drop_old_images(messages, 0) == 2 and count_images(messages) == 0


async def test_the_step_limit_stops_a_model_that_never_answers() -> None:
    model = FakeModel(lambda n: Reply(None, (call("rig_list", n=n),)))
    lines: list[str] = []
    outcome = await agent(model, FakeRigd(), lines, max_steps=3).run("loop forever")
    assert outcome.stop is Stop.STEP_LIMIT and outcome.steps == 3 and outcome.stop.exit_code == 1
    assert len(model.sent) == 3
    assert lines[-1] == "stopped: the step limit (3) was reached before a final answer"


async def test_it_closes_the_rigs_its_conversation_opened_and_nothing_else() -> None:
    rigd = FakeRigd([
        {"id": "rig_old", "surface": "terminal", "phase": "ready", "conversation": "conv-1"},
        {"id": "rig_theirs", "surface": "terminal", "phase": "ready", "conversation": "other"},
    ])
    original = rigd.__call__

    def also_someone_else(method: str, params: dict[str, Any]) -> Any:
        if method == "tools.call":  # another client opens a rig in the same workspace meanwhile
            rigd.open("someone-else", "computer")
        return original(method, params)

    model = FakeModel([Reply(None, (call("computer_use", {"action": "screenshot"}),)), Reply("done")])
    lines: list[str] = []
    run = Agent(model, also_someone_else, workspace="ws-1", conversation="conv-1", out=lines.append)
    outcome = await run.run("t")

    assert outcome.closed == ["rig_computer3"] and outcome.kept == []
    assert [p["rigId"] for p in rigd.methods("rig.close")] == ["rig_computer3"]
    assert {r["id"]: r["phase"] for r in rigd.rigs} == {
        "rig_old": "ready", "rig_theirs": "ready", "rig_computer2": "ready", "rig_computer3": "closed"}
    assert lines[-1] == "closed rig_computer3"
    # rig.list of this workspace before and after the run.
    assert rigd.methods("rig.list") == [{"workspace": "ws-1"}, {"workspace": "ws-1"}]


async def test_a_seated_run_sends_its_seat_and_lets_go_of_it_at_the_end() -> None:
    """--seat: every tool call names the seat; the seat's rig lasts (no conversation owns it, so
    the run closes nothing of it) and the run releases the seat for the next conversation."""
    model = FakeModel([Reply(None, (call("terminal_use", {"action": "exec", "command": "ls /workspace"}),)),
                       Reply("done")])
    rigd, lines = FakeRigd(), []
    rigd.tool_reply = lambda params: text_result("exit code: 0", rigId="rig_seat")
    outcome = await agent(model, rigd, lines, seat="ada").run("t")
    assert outcome.stop is Stop.ANSWER and outcome.closed == []
    assert [p["seat"] for p in rigd.methods("tools.call")] == ["ada"]
    assert rigd.methods("seat.release") == [{"workspace": "ws-1", "name": "ada", "conversation": "conv-1"}]
    assert lines[-1] == "released seat ada"


async def test_keep_leaves_them_open_and_says_so() -> None:
    rigd, lines = FakeRigd(), []
    model = FakeModel([Reply(None, (call("terminal_use", {"action": "exec", "argv": ["true"]}),)), Reply("ok")])
    outcome = await agent(model, rigd, lines, keep_rigs=True).run("t")
    assert outcome.kept == ["rig_terminal0"] and outcome.closed == []
    assert rigd.methods("rig.close") == [] and rigd.rigs[0]["phase"] == "ready"
    assert lines[-1] == "kept rig_terminal0 (--keep)"


async def test_a_rig_the_model_closed_itself_is_not_closed_again() -> None:
    rigd = FakeRigd()

    def reply(params: dict[str, Any]) -> Any:
        if params["name"] == "rig_close":  # the server closes it, as tools.call's rig_close does
            rigd("rig.close", {"rigId": params["arguments"]["rigId"]})
            return text_result(f"Closed {params['arguments']['rigId']}.")
        rig = rigd.open(params["conversation"], "terminal")
        return text_result("exit code: 0", rigId=rig["id"])

    rigd.tool_reply = reply
    model = FakeModel([Reply(None, (call("terminal_use", {"action": "exec", "argv": ["true"]}),)),
                       Reply(None, (call("rig_close", {"rigId": "rig_terminal0"}),)), Reply("ok")])
    outcome = await agent(model, rigd, []).run("t")
    assert outcome.closed == [] and rigd.rigs[0]["phase"] == "closed"
    assert len(rigd.methods("rig.close")) == 1  # the model's own


async def test_tool_failures_go_back_to_the_model_as_tool_results() -> None:
    rigd = FakeRigd()
    failures = {"rig_close": ClientError("cannot reach rigd at http://127.0.0.1:1: refused")}

    def reply(params: dict[str, Any]) -> Any:
        if params["name"] in failures:
            raise failures[params["name"]]
        if params["name"] == "computer_use":  # the server's own refusal, as a result
            return text_result("error: action.coordinate: (9999, 1) is outside the 1280x800 display",
                               error=True, error_data={"field": "action.coordinate"})
        return {"content": "not a list"}  # a reply of the wrong shape

    rigd.tool_reply = reply
    calls = (
        call("shell_use", {"command": "ls"}),                       # not a tool
        call("terminal_use", raw="{not json"),                      # broken JSON
        call("terminal_use", raw="[1, 2]"),                         # not an object
        call("terminal_use", {"action": "exec", "timeoutS": "soon"}),  # breaks the schema
        call("rig_close", {"rigId": "rig_x"}),                      # the RPC fails
        call("computer_use", {"action": "left_click", "coordinate": [9999, 1]}),  # isError from rigd
        call("rig_list"),                                           # a malformed reply
        ToolCall("call_custom", "grep", "pattern", kind="custom"),  # a custom tool call
    )
    model = FakeModel([Reply(None, calls), Reply("I give up.")])
    lines: list[str] = []
    outcome = await agent(model, rigd, lines).run("t")
    assert outcome.stop is Stop.ANSWER

    results = [m["content"] for m in tool_messages(model.sent[1])]
    assert [m["tool_call_id"] for m in tool_messages(model.sent[1])] == [c.id for c in calls]
    assert results[0].startswith("error: name: unknown tool 'shell_use'; one of browser_use, computer_use")
    assert results[1] == "error: arguments: is not valid JSON"
    assert results[2] == "error: arguments: must be a JSON object"
    assert results[3].startswith("error: arguments.timeoutS:")
    assert results[4] == "error: cannot reach rigd at http://127.0.0.1:1: refused"
    assert results[5] == "error: action.coordinate: (9999, 1) is outside the 1280x800 display"
    assert results[6] == "error: rigd's reply to rig_list is malformed: result.content: must be a list"
    assert results[7] == "error: type: only function tools are offered, not a custom tool"
    # Only the well-formed calls reached the server.
    assert [p["name"] for p in rigd.methods("tools.call")] == ["rig_close", "computer_use", "rig_list"]
    assert sum(1 for line in lines if "← failed: error:" in line) == len(calls)


async def test_a_failing_model_ends_the_run_and_its_rigs_are_closed() -> None:
    rigd, lines = FakeRigd(), []
    model = FakeModel([Reply(None, (call("terminal_use", {"action": "exec", "argv": ["true"]}),)),
                       ModelError("HTTP 500 from the model endpoint: overloaded")])
    outcome = await agent(model, rigd, lines).run("t")
    assert outcome.stop is Stop.MODEL_ERROR and outcome.steps == 1 and outcome.stop.exit_code == 2
    assert outcome.closed == ["rig_terminal0"]
    assert "[2] stopped: HTTP 500 from the model endpoint: overloaded" in lines


async def test_an_interrupt_stops_a_request_in_flight_and_closes_the_rigs() -> None:
    entered, release = threading.Event(), threading.Event()

    def script(n: int) -> Reply:
        if n == 1:
            return Reply(None, (call("terminal_use", {"action": "exec", "argv": ["true"]}),))
        entered.set()
        release.wait(20)  # a request that takes long; the interrupt abandons it
        return Reply("too late")

    rigd, lines = FakeRigd(), []
    run = agent(FakeModel(script), rigd, lines)
    try:
        with trio.fail_after(10):
            async with trio.open_nursery() as nursery:
                box: list[Any] = []

                async def go() -> None:
                    box.append(await run.run("t"))

                nursery.start_soon(go)
                while not entered.is_set():
                    await trio.sleep(0.01)
                run.interrupt()
    finally:
        release.set()
    outcome = box[0]
    assert outcome.stop is Stop.INTERRUPTED and outcome.steps == 2 and outcome.stop.exit_code == 130
    assert outcome.closed == ["rig_terminal0"] and rigd.rigs[0]["phase"] == "closed"
    assert not any("too late" in line for line in lines)


async def test_an_interrupt_while_the_tools_are_fetched_asks_no_model() -> None:
    entered, release = threading.Event(), threading.Event()
    rigd = FakeRigd()

    def slow_listing(method: str, params: dict[str, Any]) -> Any:
        if method == "tools.list":
            entered.set()
            release.wait(20)
        return rigd(method, params)

    model = FakeModel([Reply("never asked")])
    run = Agent(model, slow_listing, workspace="ws-1", conversation="conv-1", out=lambda _: None)
    try:
        with trio.fail_after(10):
            async with trio.open_nursery() as nursery:
                box: list[Any] = []

                async def go() -> None:
                    box.append(await run.run("t"))

                nursery.start_soon(go)
                while not entered.is_set():
                    await trio.sleep(0.01)
                run.interrupt()
    finally:
        release.set()
    assert box[0].stop is Stop.INTERRUPTED and box[0].steps == 0
    assert model.sent == [] and rigd.methods("rig.list") == [] and rigd.methods("rig.close") == []


async def test_ctrl_c_is_an_interrupt() -> None:
    entered, release = threading.Event(), threading.Event()

    def script(n: int) -> Reply:
        entered.set()
        release.wait(20)
        return Reply("too late")

    rigd, lines = FakeRigd([{"id": "rig_a", "surface": "terminal", "phase": "ready", "conversation": "c"}]), []
    run = agent(FakeModel(script), rigd, lines)
    try:
        with trio.fail_after(10):
            async with trio.open_nursery() as nursery:
                box: list[Any] = []

                async def go() -> None:
                    box.append(await run_interruptible(run, "t"))

                nursery.start_soon(go)
                while not entered.is_set():
                    await trio.sleep(0.01)
                os.kill(os.getpid(), signal.SIGINT)  # the receiver is installed: the model was asked
    finally:
        release.set()
    assert box[0].stop is Stop.INTERRUPTED and "rigd agent: interrupted" in lines
    assert rigd.rigs[0]["phase"] == "ready"  # not this run's


async def test_a_second_interrupt_gives_up_closing() -> None:
    entered, release = threading.Event(), threading.Event()
    rigd = FakeRigd()
    original = rigd.__call__

    def slow_close(method: str, params: dict[str, Any]) -> Any:
        if method == "rig.close":
            entered.set()
            release.wait(20)
        return original(method, params)

    model = FakeModel([Reply(None, (call("terminal_use", {"action": "exec", "argv": ["true"]}),)), Reply("ok")])
    lines: list[str] = []
    run = Agent(model, slow_close, workspace="ws-1", conversation="conv-1", out=lines.append)
    try:
        with trio.fail_after(10):
            async with trio.open_nursery() as nursery:
                box: list[Any] = []

                async def go() -> None:
                    box.append(await run.run("t"))

                nursery.start_soon(go)
                while not entered.is_set():
                    await trio.sleep(0.01)
                run.interrupt()  # the loop has already ended: this one is the first
                run.interrupt()  # and this one gives up the close in flight
    finally:
        release.set()
    assert box[0].stop is Stop.ANSWER and box[0].closed == []
    assert lines[-1] == "rigd agent: gave up closing this run's rigs; see `rigd list`"


async def test_no_tools_no_run() -> None:
    def down(method: str, params: dict[str, Any]) -> Any:
        raise ClientError("cannot reach rigd at http://127.0.0.1:1: refused")

    model = FakeModel([Reply("never asked")])
    with pytest.raises(AgentError, match="cannot list rigd's tools: cannot reach rigd"):
        await Agent(model, down, out=lambda _: None).run("t")
    assert model.sent == []


async def test_what_a_rig_or_a_model_says_cannot_drive_this_terminal() -> None:
    rigd = FakeRigd()
    rigd.tool_reply = lambda params: text_result("exit code: 0\n\x1b]0;owned\x07\x1b[2Jhi")
    model = FakeModel([Reply("\x1b[31mred\x1b[0m", (call("rig_list"),)), Reply("ok")])
    lines: list[str] = []
    await agent(model, rigd, lines).run("t")
    assert not any("\x1b" in line or "\x07" in line for line in lines)
    assert "[1] \\x1b[31mred\\x1b[0m" in lines
    assert "[1] ← ok: exit code: 0 \\x1b]0;owned\\x07\\x1b[2Jhi" in lines
    assert printable("a\tb\nc") == "a\tb\nc"


def test_the_loop_refuses_a_nonsense_configuration() -> None:
    with pytest.raises(ValueError, match="max_steps"):
        Agent(FakeModel([]), FakeRigd(), max_steps=0)
    with pytest.raises(ValueError, match="keep_images"):
        Agent(FakeModel([]), FakeRigd(), keep_images=-1)
    assert Agent(FakeModel([]), FakeRigd()).conversation.startswith("agent-")


@pytest.mark.parametrize(("reply", "field"), [
    ([], "result"),
    ({"tools": {}}, "result.tools"),
    ({"tools": [{"type": "other"}]}, "result.tools[0].type"),
    ({"tools": [{"type": "function", "function": {"name": 7}}]}, "result.tools[0].function.name"),
    ({"tools": [{"type": "function", "function": {"name": ""}}]}, "result.tools[0].function.name"),
    ({"tools": [{"type": "function", "function": {"name": "x", "parameters": {"type": "array"}}}]},
     "result.tools[0].function.parameters.type"),
    ({"tools": [{"type": "function", "function": {"name": "x", "parameters": {
        "type": "object", "properties": {"a": {"type": 5}}}}}]}, "result.tools[0].function.parameters"),
])
def test_a_malformed_tool_listing_names_the_field(reply: Any, field: str) -> None:
    with pytest.raises(ReplyError) as err:
        parse_tool_list(reply)
    assert err.value.field == field


async def test_a_malformed_tool_listing_stops_the_run_before_the_model_is_asked() -> None:
    def rpc(method: str, params: dict[str, Any]) -> Any:
        return {"tools": [{"type": "function", "function": {"name": 7}}]}

    model = FakeModel([Reply("never asked")])
    with pytest.raises(AgentError, match=r"malformed: result.tools\[0\].function.name"):
        await Agent(model, rpc, out=lambda _: None).run("t")
    assert model.sent == []


@pytest.mark.parametrize(("reply", "field"), [
    ({"content": [{"type": "image", "mimeType": "text/html", "data": "AAAA"}]}, "result.content[0].mimeType"),
    ({"content": [{"type": "image", "mimeType": "image/png", "data": "<script>"}]}, "result.content[0].data"),
    ({"content": [{"type": "audio"}]}, "result.content[0]"),
    ({"content": [], "isError": "yes"}, "result.isError"),
    ({"content": [], "rigId": 5}, "result.rigId"),
])
def test_a_malformed_tool_result_names_the_field(reply: Any, field: str) -> None:
    with pytest.raises(ReplyError) as err:
        parse_call_result(reply)
    assert err.value.field == field


# -- the SDK adapter (its real client, an in-memory transport) -------------------------------------


def sdk_model(handler: Callable[[httpx2.Request], httpx2.Response]) -> OpenAIModel:
    client = openai.OpenAI(base_url="http://model.test/v1", api_key="sk-test-secret", max_retries=0,
                           http_client=httpx2.Client(transport=httpx2.MockTransport(handler)))
    return OpenAIModel(client, "scripted-1")


def completion(message: dict[str, Any]) -> dict[str, Any]:
    return {"id": "c1", "object": "chat.completion", "created": 0, "model": "scripted-1",
            "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", **message}}]}


def test_the_adapter_sends_history_and_tools_and_reads_tool_calls() -> None:
    seen: list[dict[str, Any]] = []

    def handler(request: httpx2.Request) -> httpx2.Response:
        seen.append({"path": request.url.path, "auth": request.headers.get("authorization"),
                     "body": json.loads(request.content)})
        return httpx2.Response(200, json=completion({"content": "hm", "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "rig_list", "arguments": "{}"}}]}))

    tools = [{"type": "function", "function": {"name": "rig_list", "parameters": {"type": "object"}}}]
    shot = {"role": "user", "content": [{"type": "text", "text": "The screenshot:"},
                                        {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{png(1)}"}}]}
    reply = sdk_model(handler)([{"role": "user", "content": "t"}, shot], tools)
    assert reply == Reply("hm", (ToolCall("call_1", "rig_list", "{}"),))
    assert seen[0]["path"] == "/v1/chat/completions" and seen[0]["auth"] == "Bearer sk-test-secret"
    assert seen[0]["body"]["model"] == "scripted-1" and seen[0]["body"]["tools"] == tools
    assert seen[0]["body"]["messages"] == [{"role": "user", "content": "t"}, shot]


def test_the_adapter_turns_endpoint_failures_into_model_errors() -> None:
    def refuse(request: httpx2.Request) -> httpx2.Response:
        return httpx2.Response(429, json={"error": {"message": "slow down", "type": "rate_limit"}})

    with pytest.raises(ModelError, match="HTTP 429 from the model endpoint") as err:
        sdk_model(refuse)([{"role": "user", "content": "t"}], [])
    assert "sk-test-secret" not in str(err.value)

    def empty(request: httpx2.Request) -> httpx2.Response:
        return httpx2.Response(200, json={**completion({"content": "x"}), "choices": []})

    with pytest.raises(ModelError, match="choices: the endpoint returned no choice"):
        sdk_model(empty)([{"role": "user", "content": "t"}], [])

    def refusal(request: httpx2.Request) -> httpx2.Response:
        return httpx2.Response(200, json=completion({"content": None, "refusal": "I cannot."}))

    assert sdk_model(refusal)([{"role": "user", "content": "t"}], []) == Reply("I cannot.")


# -- the command line -----------------------------------------------------------------------------


@pytest.mark.parametrize(("extra", "env", "message"), [
    (["--base-url", "ftp://x"], {"OPENAI_API_KEY": "k"}, "--base-url: must be an http(s) URL"),
    (["--max-steps", "0"], {"OPENAI_API_KEY": "k"}, "--max-steps: must be between 1 and 1000"),
    (["--keep-images", "-1"], {"OPENAI_API_KEY": "k"}, "--keep-images: must be between 0 and 10"),
    (["--conversation", "a b"], {"OPENAI_API_KEY": "k"}, "--conversation: must be 1-128 characters"),
    ([], {}, "no API key: set OPENAI_API_KEY or pass --api-key-file"),
    (["--api-key-file", "/nonexistent/key"], {}, "cannot read the API key file /nonexistent/key"),
])
def test_the_command_names_what_is_wrong(extra: list[str], env: dict[str, str], message: str,
                                         monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    argv = ["agent", "--url", "http://127.0.0.1:1", "--token", "t", "--base-url", "http://127.0.0.1:2/v1",
            "--model", "m", *extra, "do it"]
    assert cli.main(argv) == 2
    assert message in capsys.readouterr().err


def test_an_empty_key_file_is_refused(tmp_path: Any, monkeypatch: pytest.MonkeyPatch,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    key = tmp_path / "key"
    key.write_text("\n")
    monkeypatch.setenv("OPENAI_API_KEY", "from-env")
    argv = ["agent", "--url", "http://127.0.0.1:1", "--token", "t", "--base-url", "http://127.0.0.1:2/v1",
            "--model", "m", "--api-key-file", str(key), "do it"]
    assert cli.main(argv) == 2
    assert f"the API key file {key} is empty" in capsys.readouterr().err
