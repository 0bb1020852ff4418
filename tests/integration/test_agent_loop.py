"""``rigd agent`` end to end without VMs: the real command (the ``openai`` SDK's client, the RPC
client) against a scripted OpenAI-compatible endpoint on loopback (``http.server`` in a thread)
and a real rigd server. The model only lists rigs and makes a call the loop refuses, so no rig
boots; what the endpoint was sent is checked afterwards."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from tests.integration.conftest import REPO, Server, make_data_dir, serving

pytestmark = pytest.mark.timeout(90)

API_KEY = "sk-test-" + "7" * 24


@dataclass
class ScriptedEndpoint:
    """``/v1/chat/completions`` answering the n-th request with ``script[n]`` (an assistant message,
    or ``(status, body)``); every request's headers and body are kept."""

    script: list[dict[str, Any] | tuple[int, dict[str, Any]]]
    requests: list[dict[str, Any]] = field(default_factory=list)
    base_url: str = ""

    def handler(self) -> type[BaseHTTPRequestHandler]:
        endpoint = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                endpoint.requests.append({"path": self.path, "auth": self.headers.get("Authorization"),
                                          "body": body})
                n = len(endpoint.requests) - 1
                step = endpoint.script[n] if n < len(endpoint.script) else (500, {"error": {
                    "message": "the script is over"}})
                if isinstance(step, tuple):
                    status, reply = step
                else:
                    status, reply = 200, {
                        "id": f"chatcmpl-{n}", "object": "chat.completion", "created": 0,
                        "model": body.get("model"),
                        "choices": [{"index": 0, "message": {"role": "assistant", **step},
                                     "finish_reason": "tool_calls" if step.get("tool_calls") else "stop"}]}
                data = json.dumps(reply).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        return Handler


@pytest.fixture
def endpoint_factory() -> Iterator[Callable[[list[Any]], ScriptedEndpoint]]:
    servers: list[ThreadingHTTPServer] = []

    def start(script: list[Any]) -> ScriptedEndpoint:
        endpoint = ScriptedEndpoint(script)
        httpd = ThreadingHTTPServer(("127.0.0.1", 0), endpoint.handler())
        threading.Thread(target=httpd.serve_forever, daemon=True).start()
        servers.append(httpd)
        endpoint.base_url = f"http://127.0.0.1:{httpd.server_address[1]}/v1"
        return endpoint

    yield start
    for httpd in servers:
        httpd.shutdown()
        httpd.server_close()


@pytest.fixture(scope="module")
def rigd_server() -> Iterator[Server]:
    with serving(make_data_dir()) as srv:
        yield srv


def run_agent(srv: Server, endpoint: ScriptedEndpoint, tmp_path: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    token_file = tmp_path / "token"
    token_file.write_text(srv.token + "\n")
    token_file.chmod(0o600)
    env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower() and not k.startswith("RIGD_")}
    env |= {"OPENAI_API_KEY": API_KEY, "PYTHONPATH": str(REPO)}
    argv = [sys.executable, "-m", "rigd.cli", "agent", "--url", srv.url, "--token-file", str(token_file),
            "--base-url", endpoint.base_url, "--model", "scripted-1", "--workspace", "default", *extra,
            "How many rigs are open?"]
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, cwd=REPO, env=env)


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
