"""``rigd agent`` end to end: the real command (the ``openai`` SDK's client, the RPC client)
against a scripted OpenAI-compatible endpoint on loopback and a real rigd server. The first
tests boot no rig (the model lists rigs and makes a call the loop refuses); the last has the
model do a task in a real terminal rig, which the run closes. What the endpoint was sent is
checked afterwards. The desktop's turn is in test_computer (it shares that module's rig)."""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration.conftest import Server
from tests.integration.scripted_model import (
    API_KEY,
    ScriptedEndpoint,
    run_agent,
    scripted_endpoint,
    tool_call,
)

pytestmark = pytest.mark.timeout(90)


@pytest.fixture
def endpoint_factory() -> Iterator[Callable[[list[Any]], ScriptedEndpoint]]:
    with contextlib.ExitStack() as stack:
        yield lambda script: stack.enter_context(scripted_endpoint(script))


@pytest.fixture
def rigd_server(shared_server: Server) -> Server:
    """The worker's shared server (its rigs in ``default`` are closed after each test)."""
    return shared_server


def test_the_real_sdk_path_lists_rigs_reads_a_refusal_and_answers(
        rigd_server: Server, endpoint_factory: Callable[[list[Any]], ScriptedEndpoint], tmp_path: Path) -> None:
    endpoint = endpoint_factory([
        {"content": "Checking.", "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "rig_list", "arguments": "{}"}}]},
        {"content": None, "tool_calls": [
            {"id": "call_2", "type": "function",
             "function": {"name": "terminal_use", "arguments": '{"action": "exec", "timeoutS": "soon"}'}}]},
        {"content": "No rigs are open."},
    ])
    before = rigd_server.call("rig.list", {"workspace": "default", "includeClosed": True})
    proc = run_agent(rigd_server, endpoint, tmp_path, "--max-steps", "5")
    assert proc.returncode == 0, proc.stdout + proc.stderr

    # Three requests, each with the key, the model and rigd's tools.
    assert len(endpoint.requests) == 3
    for req in endpoint.requests:
        assert req["path"] == "/v1/chat/completions" and req["auth"] == f"Bearer {API_KEY}"
        assert req["body"]["model"] == "scripted-1"
        assert [t["function"]["name"] for t in req["body"]["tools"]] == [
            "rig_list", "rig_close", "terminal_use", "computer_use", "browser_use"]
    first = endpoint.requests[0]["body"]["messages"]
    assert [m["role"] for m in first] == ["system", "user"]
    assert first[1]["content"] == "How many rigs are open?"
    # The real server's rig_list result went back as the tool result of call_1.
    second = endpoint.requests[1]["body"]["messages"]
    assert second[-2]["role"] == "assistant" and second[-2]["tool_calls"][0]["id"] == "call_1"
    assert second[-1] == {"role": "tool", "tool_call_id": "call_1", "content": "No open rigs in this workspace."}
    # The call with a bad argument came back as a readable error (and cost no rig).
    third = endpoint.requests[2]["body"]["messages"]
    assert third[-1]["role"] == "tool" and third[-1]["tool_call_id"] == "call_2"
    assert third[-1]["content"].startswith("error: arguments.timeoutS:")
    after = rigd_server.call("rig.list", {"workspace": "default", "includeClosed": True})
    assert after == before

    out = proc.stdout.splitlines()
    assert "[1] Checking." in out and "[1] → rig_list {}" in out
    assert "[1] ← ok: No open rigs in this workspace." in out
    assert any(line.startswith("[2] ← failed: error: arguments.timeoutS:") for line in out)
    assert "[3] No rigs are open." in out and "[3] done: the model answered" in out
    for secret in (API_KEY, rigd_server.token):
        assert secret not in proc.stdout and secret not in proc.stderr


def test_an_endpoint_that_refuses_ends_the_run_with_its_reason(
        rigd_server: Server, endpoint_factory: Callable[[list[Any]], ScriptedEndpoint], tmp_path: Path) -> None:
    endpoint = endpoint_factory([(400, {"error": {"message": "model 'scripted-1' does not take tools",
                                                  "type": "invalid_request_error"}})])
    proc = run_agent(rigd_server, endpoint, tmp_path)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert len(endpoint.requests) == 1  # a 400 is not retried
    assert any(line.startswith("[1] stopped: HTTP 400 from the model endpoint:") and "does not take tools" in line
               for line in proc.stdout.splitlines()), proc.stdout
    assert API_KEY not in proc.stdout + proc.stderr


def test_a_step_limit_stops_the_run(
        rigd_server: Server, endpoint_factory: Callable[[list[Any]], ScriptedEndpoint], tmp_path: Path) -> None:
    listing = {"content": None, "tool_calls": [
        {"id": "call_x", "type": "function", "function": {"name": "rig_list", "arguments": "{}"}}]}
    endpoint = endpoint_factory([listing, listing, listing])
    proc = run_agent(rigd_server, endpoint, tmp_path, "--max-steps", "2")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert len(endpoint.requests) == 2
    assert proc.stdout.splitlines()[-1] == "stopped: the step limit (2) was reached before a final answer"


@pytest.mark.vm
@pytest.mark.timeout(400)
@pytest.mark.skipif(shutil.which("qemu-system-x86_64") is None, reason="needs QEMU")
def test_a_task_in_a_real_terminal_rig_is_done_and_the_rig_closed(
        rigd_server: Server, endpoint_factory: Callable[[list[Any]], ScriptedEndpoint], tmp_path: Path) -> None:
    endpoint = endpoint_factory([
        {"content": "Writing the file.", "tool_calls": [tool_call("call_1", "terminal_use", {
            "action": "exec", "command": "echo agent-$((6*7)) > /tmp/task.txt && uname -s"})]},
        {"content": None, "tool_calls": [tool_call("call_2", "terminal_use", {
            "action": "exec", "argv": ["cat", "/tmp/task.txt"]})]},
        {"content": "The file says agent-42."},
    ])
    proc = run_agent(rigd_server, endpoint, tmp_path, "--conversation", "c-task", timeout_s=360,
                     task="Write agent-42 to /tmp/task.txt in a terminal and read it back.")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert len(endpoint.requests) == 3
    first, second = (endpoint.requests[i]["body"]["messages"][-1] for i in (1, 2))
    assert first["role"] == "tool" and first["tool_call_id"] == "call_1"
    assert "Linux" in first["content"] and "exit code: 0" in first["content"], first
    assert second["tool_call_id"] == "call_2" and "agent-42" in second["content"], second
    # The rig the run opened for its conversation is closed at the end, and said so.
    [rig] = [r for r in rigd_server.call("rig.list", {"workspace": "default", "includeClosed": True})
             if r.get("conversation") == "c-task"]
    assert rig["surface"] == "terminal" and rig["phase"] == "closed", rig
    assert f"closed {rig['id']}" in proc.stdout.splitlines(), proc.stdout
    assert "[3] done: the model answered" in proc.stdout
