"""The command line (issue 28, item 4): a client command finds the server without importing it,
and ``rigd serve --pool`` refuses a bad value naming the flag before anything starts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rigd.client import cli

REPO = Path(__file__).resolve().parents[2]

#: What a client command (list, act, open, close) must not pay for: the server, the rig
#: domain, the machines, the event loop, the MCP SDK.
HEAVY = ("rigd.server", "rigd.rigs", "rigd.backends", "rigd.browser", "rigd.images", "trio", "mcp",
         "hypercorn", "quart")

PROBE = """
import sys
from rigd.client import cli
rc = cli.main(sys.argv[1:])
print("RC", rc)
print("MODULES", " ".join(sorted(m for m in sys.modules)))
"""


@pytest.mark.parametrize("argv", [["list"], ["act", "rig_x", "exec", "--", "true"], ["close", "rig_x"],
                                  ["open", "--surface", "terminal"], ["fork", "rig_x", "-n", "3"]])
def test_a_client_command_does_not_import_the_server(tmp_path: Path, argv: list[str]) -> None:
    # An empty data directory: the command stops at "no server URL", before any socket.
    env = {k: v for k, v in os.environ.items() if k not in ("RIGD_URL", "RIGD_TOKEN")}
    env["RIGD_DATA_DIR"] = str(tmp_path)
    out = subprocess.run([sys.executable, "-c", PROBE, *argv], capture_output=True, text=True, env=env,
                         cwd=REPO, timeout=60)
    assert "RC 2" in out.stdout and "no server URL" in out.stderr, (out.stdout[-500:], out.stderr)
    modules = out.stdout.split("MODULES", 1)[1].split()
    loaded = [m for m in modules if any(m == h or m.startswith(h + ".") for h in HEAVY)]
    assert loaded == [], loaded


def test_the_data_directory_is_found_where_the_server_writes_it(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "server.json").write_text(json.dumps({"url": "http://127.0.0.1:1"}))
    (tmp_path / "admin.token").write_text("tok\n")
    monkeypatch.setenv("RIGD_DATA_DIR", str(tmp_path))
    monkeypatch.delenv("RIGD_URL", raising=False)
    monkeypatch.delenv("RIGD_TOKEN", raising=False)
    client = cli.Client.from_args(cli.parser().parse_args(["list"]))
    assert (client.url, client.token) == ("http://127.0.0.1:1", "tok")


@pytest.mark.parametrize("flag", ["phone=1", "terminal=lots", "terminal", "browser:chromium=9"])
def test_serve_refuses_a_bad_pool_naming_the_flag(flag: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["serve", "--data-dir", "/nonexistent/rigd-test", "--pool", flag]) == 2
    assert "--pool" in capsys.readouterr().err


def test_serve_refuses_pools_that_cannot_fit_the_budget(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["serve", "--data-dir", "/nonexistent/rigd-test", "--memory-budget-mb", "2048",
                     "--pool", "computer=1"]) == 2
    err = capsys.readouterr().err
    assert "--pool" in err and "2048 MB" in err, err
