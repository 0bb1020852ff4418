"""A scripted OpenAI-compatible endpoint on loopback (``http.server`` in a thread) and the real
``rigd agent`` command run against it, for the integration tests of the reference loop."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from tests.integration.conftest import REPO, Server

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


@contextmanager
def scripted_endpoint(script: list[Any]) -> Iterator[ScriptedEndpoint]:
    endpoint = ScriptedEndpoint(script)
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), endpoint.handler())
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    endpoint.base_url = f"http://127.0.0.1:{httpd.server_address[1]}/v1"
    try:
        yield endpoint
    finally:
        httpd.shutdown()
        httpd.server_close()


def tool_call(call_id: str, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}


def run_agent(srv: Server, endpoint: ScriptedEndpoint, tmp_path: Path, *extra: str,
              task: str = "How many rigs are open?", timeout_s: float = 60) -> subprocess.CompletedProcess[str]:
    token_file = tmp_path / "token"
    token_file.write_text(srv.token + "\n")
    token_file.chmod(0o600)
    env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower() and not k.startswith("RIGD_")}
    env |= {"OPENAI_API_KEY": API_KEY, "PYTHONPATH": str(REPO)}
    argv = [sys.executable, "-m", "rigd", "agent", "--url", srv.url, "--token-file", str(token_file),
            "--base-url", endpoint.base_url, "--model", "scripted-1", "--workspace", "default", *extra,
            task]
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, cwd=REPO, env=env)
