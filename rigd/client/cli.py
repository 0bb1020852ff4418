"""The ``rigd`` command: the server, and thin RPC clients for people and scripts.

Clients find the server and a token from ``--url``/``--token``, then
``RIGD_URL``/``RIGD_TOKEN``, then ``<dataDir>/server.json`` and
``<dataDir>/admin.token`` (API.md).

Why one module of this size: the whole command line is one ``argparse`` table
(:func:`parser`, ~180 lines of declarations) beside the small commands it dispatches to;
the clients with real logic live in their own modules (:mod:`rigd.client.lanes`,
:mod:`rigd.client.terminal`, :mod:`rigd.client.agent`).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from rigd.model import Accel


class ClientError(Exception):
    pass


class Client:
    def __init__(self, url: str, token: str) -> None:
        self.url = url.rstrip("/")
        self.token = token
        self._id = 0

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> Client:
        data_dir = Path(args.data_dir) if args.data_dir else _default_data_dir()
        url = args.url or os.environ.get("RIGD_URL")
        token = args.token or os.environ.get("RIGD_TOKEN")
        if not url:
            try:
                url = json.loads((data_dir / "server.json").read_text())["url"]
            except (OSError, ValueError, KeyError) as exc:
                raise ClientError(
                    f"no server URL: pass --url, set RIGD_URL, or start `rigd serve` "
                    f"(looked in {data_dir / 'server.json'})"
                ) from exc
        if not token:
            try:
                token = (data_dir / "admin.token").read_text().strip()
            except OSError as exc:
                raise ClientError(
                    f"no token: pass --token, set RIGD_TOKEN, or run as the server's user "
                    f"(looked in {data_dir / 'admin.token'})"
                ) from exc
        assert url is not None
        return cls(url, token)

    def call(self, method: str, params: dict[str, Any] | None = None, timeout: float = 3600) -> Any:
        self._id += 1
        body = json.dumps({"jsonrpc": "2.0", "id": self._id, "method": method, "params": params or {}})
        req = urllib.request.Request(  # noqa: S310 - the URL is the operator's own server
            self.url + "/rpc", data=body.encode(), method="POST",
            headers={"Authorization": f"Bearer {self.token}", "Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:  # noqa: S310
                reply = json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            with exc:
                try:
                    reply = json.loads(exc.read())
                except ValueError:
                    raise ClientError(f"HTTP {exc.code} from {self.url}") from exc
        except (urllib.error.URLError, OSError) as exc:
            raise ClientError(f"cannot reach rigd at {self.url}: {exc}") from exc
        if "error" in reply:
            err = reply["error"]
            data = err.get("data") or {}
            field = f" [{data['field']}: {data.get('reason', '')}]" if "field" in data else ""
            raise ClientError(f"{err.get('message')}{field}")
        return reply["result"]


def _default_data_dir() -> Path:
    from rigd.datadir import default_data_dir

    return Path(os.environ.get("RIGD_DATA_DIR") or default_data_dir())


def _print(value: Any) -> None:
    print(json.dumps(value, indent=2, ensure_ascii=False))


def _stream_bytes(stream: dict[str, Any]) -> bytes:
    import base64

    if "text" in stream:
        return str(stream["text"]).encode()
    return base64.b64decode(stream.get("base64", ""))


def _hostport(value: str | None, flag: str) -> tuple[str, int] | None:
    if not value:
        return None
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not host:
        raise ClientError(f"{flag} takes HOST:PORT, e.g. 127.0.0.53:53")
    return host.strip("[]"), int(port)


def _registry_host(value: str) -> str:
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536 or "/" in value:
        raise ClientError(f"--insecure-registry takes HOST:PORT, e.g. 127.0.0.1:5000 (not {value!r})")
    return value.lower()


def _dev_port(text: str) -> int | None:
    if text == "none":
        return None
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port (0-65535) or none") from None
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"{port} is not a port (0-65535)")
    return port


def cmd_serve(args: argparse.Namespace) -> int:
    import trio

    from rigd.backends.snapshot import warm_starts_enabled
    from rigd.logs import setup
    from rigd.rigs.pools import POOL_KEYS, check_fits, default_pools, merged, parse_pool_flag
    from rigd.server.main import ServeConfig, serve

    # Pools (issue 28): without --pool, what fits a quarter of the budget; with any, only those.
    pools = (merged(dict.fromkeys(POOL_KEYS, 0), [parse_pool_flag(v) for v in args.pool]) if args.pool
             else default_pools(args.memory_budget_mb))
    check_fits(pools, args.memory_budget_mb, "--pool")
    if not 60 <= args.pool_max_age <= 24 * 3600:
        raise ClientError("--pool-max-age takes 60 to 86400 seconds")
    setup(args.log_level)
    config = ServeConfig(
        data_dir=Path(args.data_dir) if args.data_dir else _default_data_dir(),
        host=args.host, port=args.port, accel=Accel(args.accel) if args.accel else None,
        cache_dir=Path(args.cache_dir) if args.cache_dir else None, qemu=args.qemu,
        memory_budget_mb=args.memory_budget_mb, reap_interval_s=args.reap_interval,
        warm_starts=False if args.no_warm_starts else warm_starts_enabled(),
        network=args.network, resolver=_hostport(args.resolver, "--resolver"),
        upstream_netns=args.upstream_netns,
        upstream_ca=Path(args.upstream_ca) if args.upstream_ca else None,
        insecure_registries=tuple(_registry_host(h) for h in args.insecure_registry),
        registry_auth=Path(args.registry_auth) if args.registry_auth else None,
        dev_http_port=args.dev_http_port, dev_https_port=args.dev_https_port,
        allow_lan_ports=args.allow_lan_ports,
        tcg_threads=None if args.tcg_threads == "auto" else args.tcg_threads,
        pools=pools, pool_max_age_s=float(args.pool_max_age),
    )
    with contextlib.suppress(KeyboardInterrupt):
        trio.run(serve, config)
    return 0


def _size(n: object) -> str:
    if not isinstance(n, int) or isinstance(n, bool):
        return "?"
    if n < 1024:
        return f"{n} B"
    value = float(n)
    for unit in ("KiB", "MiB", "GiB"):
        value /= 1024
        if value < 1024 or unit == "GiB":
            break
    return f"{value:.1f} {unit}"


def cmd_images_pull(args: argparse.Namespace) -> int:
    """``image.pull``, then ``image.pullStatus`` until it ends, printing progress on stderr."""
    client = Client.from_args(args)
    job = client.call("image.pull", {"ref": args.ref})
    shown = ""
    try:
        while job["state"] == "running":
            line = (f"{job['phase']}: {_size(job['bytes'])} of {_size(job['totalBytes'])}"
                    + (f", {_size(job['rateBps'])}/s" if job.get("rateBps") else "")
                    + (f", {job['etaS']} s left" if job.get("etaS") is not None else ""))
            if line != shown and sys.stderr.isatty():
                print("\r" + line.ljust(len(shown)), end="", file=sys.stderr, flush=True)
            elif line != shown:
                print(line, file=sys.stderr)
            shown = line
            time.sleep(0.5)
            job = client.call("image.pullStatus", {"pullId": job["pullId"]})
    except KeyboardInterrupt:
        job = client.call("image.pullCancel", {"pullId": job["pullId"]})
    if shown and sys.stderr.isatty():
        print(file=sys.stderr)
    if args.json:
        _print(job)
    elif job["state"] == "done":
        image = job["image"]
        print(f"{image['reference']}  ({_size(image['fetchedBytes'])} fetched, "
              f"{_size(image['reusedBytes'])} already here)")
    else:
        error = job.get("error") or {}
        print(f"rigd: the pull {job['state']}: {error.get('message', '')}", file=sys.stderr)
    return 0 if job["state"] == "done" else 1


def cmd_images_list(args: argparse.Namespace) -> int:
    rows = Client.from_args(args).call("image.list", {"source": "registry"})
    if args.json:
        _print(rows)
        return 0
    for row in rows:
        print(f"{row['reference']}  {row['digest']}  {_size(row['layerBytes'])}  pulled {row['pulled']}")
    return 0


def cmd_images_rm(args: argparse.Namespace) -> int:
    out = Client.from_args(args).call("image.rm", {"ref": args.ref})
    print(f"removed {out['reference']} ({len(out['removedBlobs'])} blobs deleted)")
    return 0


def cmd_open(args: argparse.Namespace) -> int:
    params: dict[str, Any] = {"workspace": args.workspace, "surface": args.surface}
    for key, value in (("conversation", args.conversation), ("memoryMb", args.memory_mb),
                       ("vcpus", args.vcpus), ("ttlS", args.ttl)):
        if value is not None:
            params[key] = value
    _print(Client.from_args(args).call("rig.open", params))
    return 0


def cmd_list(args: argparse.Namespace) -> int:
    rigs = Client.from_args(args).call("rig.list", {"workspace": args.workspace, "includeClosed": args.all})
    if args.json:
        _print(rigs)
    else:
        for r in rigs:
            print(f"{r['id']}  {r['surface']:9} {r['phase']:12} {r['accel'] or '-':4} {r['phaseDetail']}")
    return 0


def cmd_close(args: argparse.Namespace) -> int:
    _print(Client.from_args(args).call("rig.close", {"rigId": args.rig}))
    return 0


def cmd_fork(args: argparse.Namespace) -> int:
    answer = Client.from_args(args).call("rig.fork", {"rigId": args.rig, "count": args.count})
    if args.json:
        _print(answer)
    else:
        for r in answer["rigs"]:
            print(f"{r['id']}  {r['surface']:9} {r['phase']:12} forked from {r['forkedFrom']}")
    return 0


def cmd_act(args: argparse.Namespace) -> int:
    client = Client.from_args(args)
    if args.verb == "exec":
        ex = exec_parser().parse_args(args.rest)
        args.json = args.json or ex.json
        action: dict[str, Any] = {"action": "exec"}
        argv = ex.argv[1:] if ex.argv[:1] == ["--"] else ex.argv
        if ex.command:
            action["command"] = ex.command
        if argv:
            action["argv"] = argv
        if ex.cwd:
            action["cwd"] = ex.cwd
        if ex.timeout is not None:
            action["timeoutS"] = ex.timeout
        if ex.stdin:
            action["stdin"] = sys.stdin.read()
        result = client.call("rig.act", {"rigId": args.rig, "tool": "terminal_use", "action": action})
        if args.json:
            _print(result)
            return 0
        sys.stdout.buffer.write(_stream_bytes(result["stdout"]))
        sys.stderr.buffer.write(_stream_bytes(result["stderr"]))
        for name in ("stdout", "stderr"):
            if result[name].get("truncated"):
                print(f"rigd: {result[name].get('note')}", file=sys.stderr)
        if result.get("timedOut"):
            print("rigd: the command timed out; its process group was killed", file=sys.stderr)
            return 124
        code = result.get("exitCode")
        return code if isinstance(code, int) else 1
    try:
        action = json.loads(args.verb)
    except ValueError as exc:
        raise ClientError(
            "act takes `exec ...` or an action as JSON, e.g. '{\"action\": \"exec\", ...}'"
        ) from exc
    _print(client.call("rig.act", {"rigId": args.rig, "tool": args.tool, "action": action}))
    return 0


def exec_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="rigd act RIG exec", description="run a command in a terminal rig")
    p.add_argument("-c", "--command", help="a bash command line instead of argv")
    p.add_argument("--cwd", help="working directory (absolute)")
    p.add_argument("--timeout", type=float, help="timeout in seconds")
    p.add_argument("--stdin", action="store_true", help="pass this process's stdin")
    p.add_argument("--json", action="store_true", help="print the raw result")
    p.add_argument("argv", nargs=argparse.REMAINDER, help="-- program args...")
    return p


def cmd_rpc(args: argparse.Namespace) -> int:
    params = json.loads(args.params) if args.params else {}
    _print(Client.from_args(args).call(args.method, params))
    return 0


def check_seat(seat: str | None) -> None:
    """``--seat`` of ``rigd mcp`` and ``rigd agent``: a seat name, or a ClientError saying why."""
    from rigd.rigs.params import SEAT_NAME_RE, SEAT_NAME_RULE

    if seat is not None and not SEAT_NAME_RE.fullmatch(seat):
        raise ClientError(f"--seat: must be {SEAT_NAME_RULE}")


def cmd_mcp(args: argparse.Namespace) -> int:
    """``rigd mcp``: the agent tools as an MCP server on stdio (stdout is the protocol)."""
    from rigd.errors import FieldError
    from rigd.logs import setup
    from rigd.tools import mcp

    check_seat(args.seat)
    if args.token_file:
        try:
            args.token = Path(args.token_file).read_text().strip()
        except OSError as exc:
            raise ClientError(f"cannot read the token file {args.token_file}: {exc}") from exc
    client = Client.from_args(args)
    workspace = args.workspace
    if workspace is None:  # the token user's default: 'default', else their only workspace
        try:
            workspace = mcp.default_workspace(client.call("workspace.list"), field="--workspace")
        except FieldError as exc:
            raise ClientError(f"--workspace {exc.reason}") from exc
    setup(args.log_level)  # a StreamHandler on stderr: nothing but MCP goes to stdout
    with contextlib.suppress(KeyboardInterrupt):
        mcp.run(client.call, workspace, args.conversation or mcp.default_conversation(), args.seat)
    return 0


def _read_secret(path: str, what: str) -> str:
    try:
        value = Path(path).read_text().strip()
    except OSError as exc:
        raise ClientError(f"cannot read the {what} file {path}: {exc.strerror}") from exc
    if not value:
        raise ClientError(f"the {what} file {path} is empty")
    return value


def cmd_agent(args: argparse.Namespace) -> int:
    """``rigd agent``: the reference loop (a model on an OpenAI-compatible endpoint drives rigs)."""
    import urllib.parse

    from rigd.client import agent
    from rigd.logs import setup
    from rigd.rigs.params import ID_RE

    base = urllib.parse.urlsplit(args.base_url)
    if base.scheme not in ("http", "https") or not base.netloc:
        raise ClientError("--base-url: must be an http(s) URL, e.g. http://127.0.0.1:8000/v1")
    if args.conversation is not None and not ID_RE.match(args.conversation):
        raise ClientError("--conversation: must be 1-128 characters of letters, digits, and _ . : -")
    check_seat(args.seat)
    if not 1 <= args.max_steps <= 1000:
        raise ClientError("--max-steps: must be between 1 and 1000")
    if not 0 <= args.keep_images <= 10:
        raise ClientError("--keep-images: must be between 0 and 10")
    if not args.task.strip():
        raise ClientError("task: give the model something to do")
    if args.token_file:
        args.token = _read_secret(args.token_file, "token")
    api_key = (_read_secret(args.api_key_file, "API key") if args.api_key_file
               else os.environ.get("OPENAI_API_KEY"))
    if not api_key:
        raise ClientError("no API key: set OPENAI_API_KEY or pass --api-key-file "
                          "(an endpoint that needs none takes any value)")
    client = Client.from_args(args)
    setup(args.log_level)
    runner = agent.Agent(
        agent.open_model(args.base_url, args.model, api_key), client.call,
        workspace=args.workspace, conversation=args.conversation, max_steps=args.max_steps,
        keep_rigs=args.keep, keep_images=args.keep_images, out=lambda line: print(line, flush=True),
        seat=args.seat,
    )
    try:
        outcome = agent.run(runner, args.task)
    except agent.AgentError as exc:
        raise ClientError(str(exc)) from exc
    return outcome.stop.exit_code


def cmd_term(args: argparse.Namespace) -> int:
    from rigd.client.terminal import run_terminal

    client = Client.from_args(args)
    signed = client.call("rig.terminalUrl", {"rigId": args.rig})
    url = client.url.replace("http://", "ws://").replace("https://", "wss://") + signed["path"]
    return run_terminal(url)


def cmd_cp(args: argparse.Namespace) -> int:
    """``rigd cp LOCAL… rig_x:`` drops files; ``rigd cp rig_x:/path LOCAL`` copies one out."""
    from rigd.client.lanes import LaneClient, LaneError, split_remote

    client = Client.from_args(args)
    lanes = LaneClient(client.url, client.token)
    *sources, target = args.paths
    if not sources:
        raise ClientError("give what to copy and where: LOCAL... rig_x:  or  rig_x:/path LOCAL")
    show = True if args.progress else None
    try:
        remote = split_remote(target)
        if remote is not None:
            if remote[1]:
                raise ClientError("the server chooses where drops land: write the target as rig_x:")
            if any(split_remote(src) for src in sources):
                raise ClientError("copy between rigs through your machine, one direction at a time")
            _print(lanes.upload(remote[0], [Path(src) for src in sources], show=show))
            return 0
        if len(sources) != 1 or (src := split_remote(sources[0])) is None:
            raise ClientError("copy out one file at a time: rigd cp rig_x:/path LOCAL")
        if not src[1].startswith("/"):
            raise ClientError("the guest path must be absolute (rig_x:/root/file)")
        _print(lanes.download(src[0], src[1], Path(target), show=show))
    except LaneError as exc:
        raise ClientError(str(exc)) from exc
    return 0


def cmd_clip(args: argparse.Namespace) -> int:
    """``rigd clip get RIG`` prints the rig's clipboard; ``rigd clip set RIG`` sets it from stdin."""
    from rigd.client.lanes import LaneClient, LaneError, sniff_type

    client = Client.from_args(args)
    lanes = LaneClient(client.url, client.token)
    try:
        if args.op == "get":
            media, data = lanes.clip_get(args.rig, args.selection)
            if media is None:
                print(f"rigd: the {args.selection} selection is empty", file=sys.stderr)
                return 1
            if not media.startswith("text/") and sys.stdout.isatty():
                raise ClientError(f"the clipboard holds {media}; redirect it to a file")
            sys.stdout.buffer.write(data)
            sys.stdout.flush()
            return 0
        data = Path(args.file).read_bytes() if args.file else sys.stdin.buffer.read()
        _print(lanes.clip_set(args.rig, data, args.type or sniff_type(data)))
    except LaneError as exc:
        raise ClientError(str(exc)) from exc
    return 0


def cmd_images(args: argparse.Namespace) -> int:
    from rigd.images import build_all

    assets = build_all(Path(args.cache_dir) if args.cache_dir else None)
    print(f"terminal image {assets.image_digest}")
    print(f"kernel {assets.kernel_release}: {assets.kernel}")
    return 0


def cmd_images_desktop(args: argparse.Namespace) -> int:
    from rigd.images.desktop import build_desktop

    image = build_desktop(Path(args.cache_dir) if args.cache_dir else None)
    print(f"desktop image {image.manifest_path} (guest protocol {image.guest_protocol})")
    return 0


def cmd_images_import(args: argparse.Namespace) -> int:
    from rigd.images.importer import import_image

    data_dir = Path(args.data_dir) if args.data_dir else _default_data_dir()

    def say(msg: str) -> None:
        print(f"import: {msg}", file=sys.stderr, flush=True)

    image = import_image(args.source, args.sha256, data_dir, progress=say)
    state = "already imported" if image.already_present else "imported"
    print(f"{state}: {image.dir} (sha256:{image.sha256}, {image.manifest.surface}, "
          f"guest protocol {image.guest_protocol})")
    return 0


def cmd_probe(args: argparse.Namespace) -> int:
    import trio

    from rigd.backends.accel import native_accel, probe
    from rigd.images import find_assets

    accel = Accel(args.accel) if args.accel else native_accel()
    if accel is None:
        print("no native accelerator on this platform")
        return 1
    import logging
    import tempfile

    from netgate.cleanup import remove_tree
    from rigd.server.main import publish_assets

    built = find_assets(Path(args.cache_dir) if args.cache_dir else None)
    # Probe as rigs run: the unprivileged QEMU reads the kernel from a place
    # it can reach (the cache may sit in a private home).
    scratch = Path(tempfile.mkdtemp(prefix="rigd-probe-", dir="/var/tmp"))
    try:
        os.chmod(scratch, 0o711)  # noqa: S103 - the probe's QEMU user must traverse it
        assets = publish_assets(built, scratch)
        result = trio.run(lambda: probe(accel, qemu=args.qemu, kernel=assets.kernel,
                                        initrd=assets.initrd, deadline_s=args.deadline))
    finally:
        remove_tree(scratch, log=logging.getLogger("rigd.cli"))
    print(f"{accel}: {'works' if result.ok else 'does not work'} ({result.detail})")
    return 0 if result.ok else 1


def cmd_ca(args: argparse.Namespace) -> int:
    """The dev CA of the server this CLI talks to (``--url``, ``RIGD_URL``, ``<dataDir>/server.json``),
    fetched from its ``GET /ca.pem`` and checked against ``server.info``'s fingerprint. Nothing
    is made on this side: a CA is the server's."""
    import hashlib
    import ssl

    try:
        client: Client | None = Client.from_args(args)
    except ClientError as exc:
        if "no token" not in str(exc):
            raise
        client = None
    url = (client.url if client is not None else
           (args.url or os.environ.get("RIGD_URL") or "").rstrip("/"))
    if not url:
        raise ClientError("no server URL: pass --url, set RIGD_URL, or start `rigd serve`")
    try:
        with urllib.request.urlopen(url + "/ca.pem", timeout=30) as resp:  # noqa: S310 - the operator's server
            pem = resp.read(64 * 1024).decode("ascii")
    except urllib.error.HTTPError as exc:
        with exc:
            try:
                message = json.loads(exc.read())["error"]["message"]
            except (ValueError, KeyError, TypeError):
                message = f"HTTP {exc.code}"
        raise ClientError(f"{url} has no dev CA to give: {message}") from exc
    except (urllib.error.URLError, OSError, UnicodeDecodeError) as exc:
        raise ClientError(f"cannot fetch the dev CA from {url}: {exc}") from exc
    try:
        der = ssl.PEM_cert_to_DER_cert(pem)
    except ValueError as exc:
        raise ClientError(f"{url}/ca.pem is not a PEM certificate") from exc
    fingerprint = ":".join(f"{b:02X}" for b in hashlib.sha256(der).digest())
    checked = "not checked against server.info (no token)"
    if client is not None:
        said = client.call("server.info").get("devCaFingerprint")
        if said != fingerprint:
            raise ClientError(f"{url}/ca.pem has SHA256 {fingerprint} but server.info says {said}: "
                              "not printed")
        checked = "matches server.info"
    sys.stdout.write(pem)
    sys.stdout.flush()
    print(f"rigd: the dev CA of {url} (SHA256 {fingerprint}, {checked}); it signs only *.test and "
          f"*.localhost. Trust it on Debian/Ubuntu with `rigd ca > rigd-dev.crt && sudo cp rigd-dev.crt "
          f"/usr/local/share/ca-certificates/ && sudo update-ca-certificates`, or for curl alone with "
          f"`--cacert rigd-dev.crt`", file=sys.stderr)
    return 0


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="rigd", description="rigd: real machines for AI agents")
    sub = p.add_subparsers(dest="cmd", required=True)

    def client_opts(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("--url", help="server URL (default: RIGD_URL or <dataDir>/server.json)")
        sp.add_argument("--token", help="bearer token (default: RIGD_TOKEN or <dataDir>/admin.token)")
        sp.add_argument("--data-dir", help="the server's data directory")

    sp = sub.add_parser("serve", help="run the server")
    sp.add_argument("--data-dir")
    sp.add_argument("--host", default="127.0.0.1")
    sp.add_argument("--port", type=int, default=8470)
    sp.add_argument("--accel", choices=[a.value for a in Accel],
                    help="accelerator; default: probe kvm (Linux) or hvf (macOS); tcg only when asked")
    sp.add_argument("--cache-dir", help="where `rigd images build` put the images")
    sp.add_argument("--qemu", default="qemu-system-x86_64")
    sp.add_argument("--log-level", default="info")
    sp.add_argument("--memory-budget-mb", type=int, default=12 * 1024,
                    help="host-resident memory for all rigs together (default 12288)")
    sp.add_argument("--reap-interval", type=float, default=1.0, help=argparse.SUPPRESS)
    sp.add_argument("--network", choices=["auto", "gateway", "user", "none"], default="auto",
                    help="auto (default): a gateway namespace per rig when running as root with "
                    "CAP_NET_ADMIN, else QEMU user networking (restrict=on) relayed to the same egress "
                    "proxy; gateway/user: force one (an error if it cannot work); none: no network")
    sp.add_argument("--resolver", help="HOST:PORT of the DNS server the gateways use for "
                    "allowed names (default: the host's /etc/resolv.conf)")
    sp.add_argument("--upstream-netns", help=argparse.SUPPRESS)
    sp.add_argument("--upstream-ca", help="CA bundle for verifying brokered hosts (default: system CAs)")
    sp.add_argument("--no-warm-starts", action="store_true",
                    help="always boot cold (no per-pack memory snapshots)")
    sp.add_argument("--pool", action="append", default=[], metavar="SURFACE[:ENGINE]=N",
                    help="keep N rigs of that shape booted and unowned, taken by rig.open at once "
                    "(terminal, computer, browser:chromium|firefox|webkit; repeatable; 'none': no "
                    "pools). Default: terminal=1 and browser:chromium=1 when they fit in a quarter "
                    "of the memory budget; with any --pool, only the pools named")
    sp.add_argument("--pool-max-age", type=int, default=30 * 60, metavar="SECONDS",
                    help="a pooled rig older than this is replaced (default 1800)")
    sp.add_argument("--tcg-threads", choices=["auto", "single", "multi"], default="auto",
                    help="under TCG, one host thread per vCPU (multi) or one per rig (single); "
                    "auto (default): single on a host of fewer than 4 cores, where rigs booting "
                    "side by side were ~1.4x faster single-threaded")
    sp.add_argument("--insecure-registry", action="append", default=[], metavar="HOST:PORT",
                    help="a registry reached over plain HTTP (a loopback test registry, say); "
                    "every other registry is HTTPS only (repeatable)")
    sp.add_argument("--registry-auth", metavar="FILE",
                    help="credentials for image pulls, in docker's config.json format "
                    '({"auths": {"ghcr.io": {"auth": "<base64 user:token>"}}}), mode 0600; '
                    "default <data-dir>/registry-auth.json when it exists")
    sp.add_argument("--dev-http-port", type=_dev_port, default=0, metavar="P|none",
                    help="where dev domains (name.test, name.localhost) answer HTTP on loopback "
                    "(default 0: a free port; none: no dev domains)")
    sp.add_argument("--dev-https-port", type=_dev_port, default=0, metavar="P|none",
                    help="where dev domains answer HTTPS with the server's own CA (`rigd ca`; "
                    "default 0: a free port; none: no HTTPS lane)")
    sp.add_argument("--allow-lan-ports", action="store_true",
                    help="let rig.port.share open a forwarded port on every interface although the "
                    "server binds loopback only")
    sp.set_defaults(fn=cmd_serve)

    sp = sub.add_parser("open", help="open a rig")
    client_opts(sp)
    sp.add_argument("--surface", default="terminal")
    sp.add_argument("--workspace", default="default")
    sp.add_argument("--conversation")
    sp.add_argument("--memory-mb", type=int)
    sp.add_argument("--vcpus", type=int)
    sp.add_argument("--ttl", type=int, help="hard lifetime in seconds")
    sp.set_defaults(fn=cmd_open)

    sp = sub.add_parser("list", help="list rigs")
    client_opts(sp)
    sp.add_argument("--workspace", default="default")
    sp.add_argument("--all", action="store_true", help="include closed rigs")
    sp.add_argument("--json", action="store_true")
    sp.set_defaults(fn=cmd_list)

    sp = sub.add_parser("close", help="close a rig")
    client_opts(sp)
    sp.add_argument("rig")
    sp.set_defaults(fn=cmd_close)

    sp = sub.add_parser("fork", help="copies of a running rig, from one instant of it (RAM and disk)")
    client_opts(sp)
    sp.add_argument("rig")
    sp.add_argument("-n", "--count", type=int, default=1, help="how many copies (1-8, default 1)")
    sp.add_argument("--json", action="store_true")
    sp.set_defaults(fn=cmd_fork)

    sp = sub.add_parser(
        "act", help="run a verb: `rigd act RIG exec [-c CMD | -- argv...]` or a JSON action"
    )
    client_opts(sp)
    sp.add_argument("--tool", default="terminal_use")
    sp.add_argument("--json", action="store_true", help="print the raw result")
    sp.add_argument("rig")
    sp.add_argument("verb", help="`exec`, or a JSON action payload")
    sp.add_argument("rest", nargs=argparse.REMAINDER, help="exec options and argv (`exec --help`)")
    sp.set_defaults(fn=cmd_act)

    sp = sub.add_parser("term", help="an interactive terminal in a rig")
    client_opts(sp)
    sp.add_argument("rig")
    sp.set_defaults(fn=cmd_term)

    sp = sub.add_parser("cp", help="drop files into a rig (LOCAL... rig_x:) or copy one out "
                                   "(rig_x:/path LOCAL)")
    client_opts(sp)
    sp.add_argument("paths", nargs="+")
    sp.add_argument("--progress", action="store_true", help="show progress even when not on a terminal")
    sp.set_defaults(fn=cmd_cp)

    sp = sub.add_parser("clip", help="read or set a rig's clipboard")
    client_opts(sp)
    sp.add_argument("op", choices=["get", "set"])
    sp.add_argument("rig")
    sp.add_argument("--selection", default="clipboard", choices=["clipboard", "primary", "xdnd"])
    sp.add_argument("--file", help="set: read the content from this file instead of stdin")
    sp.add_argument("--type", help="set: the media type (default: sniffed: PNG, JPEG or UTF-8 text)")
    sp.set_defaults(fn=cmd_clip)

    sp = sub.add_parser("rpc", help="call any RPC method with JSON params")
    client_opts(sp)
    sp.add_argument("method")
    sp.add_argument("params", nargs="?")
    sp.set_defaults(fn=cmd_rpc)

    sp = sub.add_parser("mcp", help="serve the agent tools over MCP on stdio (for MCP clients)")
    client_opts(sp)
    sp.add_argument("--token-file", help="read the bearer token from this file (instead of --token)")
    sp.add_argument("--workspace", help="the workspace the tools act in (default: the token user's "
                                        "workspace named 'default', else their only one)")
    sp.add_argument("--conversation",
                    help="the conversation whose rigs the tools reuse (default: one of this process's own)")
    sp.add_argument("--seat", help="a named agent's seat: the tools drive its lasting rig (its volume at "
                                   "/workspace, its browser profile), held by the conversation")
    sp.add_argument("--log-level", default="warning", help="log level on stderr (default warning)")
    sp.set_defaults(fn=cmd_mcp)

    sp = sub.add_parser("agent", help="the reference loop: a model on an OpenAI-compatible endpoint "
                                      "drives rigs with the agent tools until it answers")
    client_opts(sp)
    sp.add_argument("--token-file", help="read the bearer token from this file (instead of --token)")
    sp.add_argument("--base-url", required=True,
                    help="the endpoint's base URL, e.g. https://api.openai.com/v1 or http://127.0.0.1:8000/v1")
    sp.add_argument("--model", required=True, help="the model name the endpoint knows")
    sp.add_argument("--api-key-file", help="read the endpoint's API key from this file "
                                           "(default: OPENAI_API_KEY)")
    sp.add_argument("--workspace", default="default", help="the workspace the tools act in")
    sp.add_argument("--conversation",
                    help="the conversation whose rigs the tools reuse (default: one of this run's own)")
    sp.add_argument("--seat", help="a named agent's seat: the tools drive its lasting rig, held for the run "
                                   "and released at its end (the rig stays)")
    sp.add_argument("--max-steps", type=int, default=30,
                    help="stop after this many model replies (default 30; exit status 1)")
    sp.add_argument("--keep-images", type=int, default=2,
                    help="screenshots kept in the history sent to the model (default 2)")
    sp.add_argument("--keep", action="store_true",
                    help="leave the rigs this run opened open (default: close them at the end)")
    sp.add_argument("--log-level", default="warning", help="log level on stderr (default warning)")
    sp.add_argument("task", help="what the model is asked to do")
    sp.set_defaults(fn=cmd_agent)

    sp = sub.add_parser("images", help="build the default images; import a desktop image")
    isub = sp.add_subparsers(dest="images_cmd", required=True)
    ib = isub.add_parser("build")
    ib.add_argument("--cache-dir")
    ib.set_defaults(fn=cmd_images)
    idk = isub.add_parser("desktop", help="build the computer (desktop) image (minutes, cached)")
    idk.add_argument("--cache-dir")
    idk.set_defaults(fn=cmd_images_desktop)
    imp = isub.add_parser(
        "import", help="copy a desktop image into the data directory if its sha256 matches")
    imp.add_argument("source", help="path, file:// or http(s):// URL of a rigd-image.json or a bare qcow2")
    imp.add_argument("--sha256", required=True, help="the digest of that file (hex or sha256:hex)")
    imp.add_argument("--data-dir", help="the server's data directory (default: $RIGD_DATA_DIR)")
    imp.set_defaults(fn=cmd_images_import)
    ipl = isub.add_parser("pull", help="pull an image from a registry into the server (by tag or digest)")
    client_opts(ipl)
    ipl.add_argument("ref", help="e.g. debian:bookworm, ghcr.io/org/app@sha256:…, 127.0.0.1:5000/t/img:v1")
    ipl.add_argument("--json", action="store_true", help="print the finished job as JSON")
    ipl.set_defaults(fn=cmd_images_pull)
    ils = isub.add_parser("list", help="list the images pulled from registries")
    client_opts(ils)
    ils.add_argument("--json", action="store_true")
    ils.set_defaults(fn=cmd_images_list)
    irm = isub.add_parser("rm", help="forget a pulled image and delete the blobs only it used")
    client_opts(irm)
    irm.add_argument("ref", help="the reference it was pulled as, or its digest")
    irm.set_defaults(fn=cmd_images_rm)

    sp = sub.add_parser("ca", help="print the dev-domain CA certificate (PEM) of the server this CLI "
                                   "talks to, to trust for https://*.test and *.localhost (never the key)")
    client_opts(sp)
    sp.set_defaults(fn=cmd_ca)

    sp = sub.add_parser("accel-probe", help="boot once to see whether an accelerator works")
    sp.add_argument("--accel", choices=[a.value for a in Accel])
    sp.add_argument("--cache-dir")
    sp.add_argument("--qemu", default="qemu-system-x86_64")
    sp.add_argument("--deadline", type=float, default=10.0)
    sp.set_defaults(fn=cmd_probe)
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        code: int = args.fn(args)
    except ClientError as exc:
        print(f"rigd: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:
        from rigd.errors import RigdError

        if isinstance(exc, RigdError):
            print(f"rigd: {exc.message}", file=sys.stderr)
            return 2
        raise
    return code


if __name__ == "__main__":
    sys.exit(main())
