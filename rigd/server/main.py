"""``rigd serve``: wire the stores, backends, RPC and HTTP server together.

Start-up order: data directory → databases and the first admin → image assets
→ accelerator → HTTP listener (``server.json`` is written once the port is
known). Shutdown (SIGINT/SIGTERM): stop accepting, close every rig with
``serverShutdown``, and only then exit, so no QEMU outlives the server.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import ipaddress
import json
import logging
import os
import shutil
import signal
import socket
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import trio
from hypercorn.config import Config as HyperConfig
from hypercorn.trio import serve as hyper_serve

from netgate.broker import SecretStore
from netgate.topology import cleanup_leftovers
from netgate.usermode import helper_python
from rigd.auth import Signer, load_or_create_key
from rigd.backends.accel import native_accel, probe
from rigd.backends.browser import browser_backend
from rigd.backends.confine import UidPool, check_reachable, make_shared_dir
from rigd.backends.desktop import desktop_backend
from rigd.backends.gates import NetworkConfig
from rigd.backends.host import QemuBackend
from rigd.backends.layout import Layout
from rigd.backends.microvm_argv import default_tcg_threads
from rigd.backends.qemu import QemuConfig
from rigd.backends.smolvm import prepare_terminals, terminal_backend
from rigd.backends.warm import SnapshotService
from rigd.browser.profiles import ProfileStore
from rigd.errors import RigdError
from rigd.images import TerminalAssets, find_assets
from rigd.images.browser import (
    CUSTOM_REVISION,
    BrowserAssets,
    add_browser_user,
    build_browser,
    ensure_browser_pack,
    find_browser,
)
from rigd.images.browser import PACKS as BROWSER_PACKS
from rigd.images.browser import Engine as ImageEngine
from rigd.images.cache import sha256_file
from rigd.images.desktop import find_desktop
from rigd.images.importer import BootChoice, ImportedImage, import_image, list_imported
from rigd.images.pack import ensure_pack
from rigd.images.registry import AUTH_FILE, Credentials, RegistryClient, load_registry_auth, parse_reference
from rigd.model import LIMITS, Accel, Surface
from rigd.ports.hub import PortsHub
from rigd.ports.tls import load_dev_ca, tls_dir
from rigd.rigs.events import EventBus
from rigd.rigs.manager import Caller, RigManager
from rigd.rigs.pools import DEFAULT_MAX_AGE_S, PoolKey
from rigd.server.app import MAX_INBOUND, ServerContext
from rigd.server.imports import ImportJobs
from rigd.server.lanes import server_app
from rigd.server.methods import build_methods
from rigd.server.pages import HOME as PAGE_HOME
from rigd.server.pulls import PullJobs
from rigd.server.rpc import Dispatcher
from rigd.store.aio import Stores
from rigd.tools.mcp import AsyncRpc, HttpEndpoint, dispatched

log = logging.getLogger("rigd")


@dataclass(slots=True)
class ServeConfig:
    data_dir: Path
    host: str = "127.0.0.1"
    port: int = 8470
    accel: Accel | None = None
    cache_dir: Path | None = None
    qemu: str = "qemu-system-x86_64"
    memory_budget_mb: int = 12 * 1024
    reap_interval_s: float = 1.0
    warm_starts: bool = True
    #: TCG's vCPU threading: "single" | "multi", or None for the host's default
    #: (:func:`rigd.backends.microvm_argv.default_tcg_threads`).
    tcg_threads: str | None = None
    #: "auto": a gateway namespace per rig when the server may manage network namespaces (root with
    #: CAP_NET_ADMIN and CAP_SYS_ADMIN, ``ip`` and ``nft`` present), else QEMU user networking
    #: (``restrict=on``) relayed to the same proxy; "gateway"/"user" force one; "none": no network.
    network: str = "auto"
    resolver: tuple[str, int] | None = None
    upstream_netns: str | None = None
    upstream_ca: Path | None = None
    #: Registries reached over plain HTTP (``host:port``); every other one over HTTPS only.
    insecure_registries: tuple[str, ...] = ()
    #: Credentials for the server's pulls (docker's config.json format); None:
    #: ``<dataDir>/registry-auth.json`` when it exists.
    registry_auth: Path | None = None
    #: The credentials read from it (by :func:`serve`, before anything starts).
    credentials: Mapping[str, Credentials] = dataclasses.field(default_factory=dict)
    #: Dev domains (RIGS.md §8): the HTTP and HTTPS ports on loopback (0 picks a free one;
    #: None turns that lane off).
    dev_http_port: int | None = 0
    dev_https_port: int | None = 0
    #: Whether ``rig.port.share {lan: true}`` may bind every interface while ``host`` is loopback.
    allow_lan_ports: bool = False
    #: Rigs kept booted per shape (issue 28: ``rigd serve --pool``); None: none.
    pools: Mapping[PoolKey, int] | None = None
    pool_max_age_s: float = DEFAULT_MAX_AGE_S


def write_private(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def share_pack(rootfs: Path) -> Path:
    """Make a pack's rootfs readable by rig uids through their overlays' backing file."""
    for d in (rootfs.parent.parent, rootfs.parent):
        os.chmod(d, 0o711)  # noqa: S103 - rig uids traverse, never list
    if rootfs.stat().st_mode & 0o777 != 0o444:
        os.chmod(rootfs, 0o444)
    return rootfs


def readable_pack(assets: TerminalAssets, data_dir: Path, progress: Callable[[str], None]) -> Path:
    """The terminal pack's rootfs (built once), readable by rig uids."""
    return share_pack(ensure_pack(assets, data_dir, progress))


async def custom_pack(data_dir: Path, pulls: PullJobs, reference: str,
                      progress: Callable[[str], None]) -> tuple[str, Path]:
    """A workspace's custom terminal image: pulled on the host if absent (never through a
    rig's gate), then unpacked once into a pack like the built image's (keyed by its digest
    and ``tools-v1``), readable by rig uids. The reference is parsed again here (at boot)."""
    ref = parse_reference(reference, "rigs.smolvm.execImage")
    digest = await pulls.ensure(ref, progress)
    rootfs = await trio.to_thread.run_sync(
        lambda: share_pack(ensure_pack(pulls.store.root, data_dir, progress, digest=digest)))
    return digest, rootfs


async def custom_browser_pack(data_dir: Path, boot: TerminalAssets, pulls: PullJobs, reference: str,
                              progress: Callable[[str], None]) -> tuple[BrowserAssets, Path]:
    """A workspace's custom Chromium image (``rigs.smolvm.browserImage``): pulled on the host if
    absent, unpacked once into a browser pack with rigd's ``browser`` user added
    (:func:`add_browser_user`), booted with the server's kernel, initramfs and tools disk."""
    ref = parse_reference(reference, "rigs.smolvm.browserImage")
    digest = await pulls.ensure(ref, progress)
    rootfs = await trio.to_thread.run_sync(lambda: share_pack(ensure_pack(
        pulls.store.root, data_dir, progress, digest=digest, revision=CUSTOM_REVISION, kind=BROWSER_PACKS,
        finish=add_browser_user)))
    assets = BrowserAssets(ImageEngine.CHROMIUM,
                           dataclasses.replace(boot, oci_layout=pulls.store.root, image_digest=digest),
                           CUSTOM_REVISION)
    return assets, rootfs


def browser_pack(data_dir: Path, cache_dir: Path | None, engine: ImageEngine,
                 progress: Callable[[str], None]) -> tuple[BrowserAssets, Path]:
    """One engine's assets (its image built on first use: minutes, once per recipe) and its
    pack's rootfs, readable by rig uids. Blocking: the browser backend runs it in a thread."""
    try:
        assets = find_browser(engine, cache_dir)
    except RigdError:
        progress(f"building the {engine.value} image (once per recipe; minutes)")
        log.info("building the %s browser image", engine.value)
        def step(message: str) -> None:
            log.info("browser image: %s", message)
            progress(f"building the {engine.value} image: {message[:160]}")

        assets = build_browser(engine, cache_dir, log=step)
    assets = dataclasses.replace(assets, boot=publish_assets(assets.boot, data_dir))
    return assets, share_pack(ensure_browser_pack(assets, data_dir, progress))


def publish_assets(assets: TerminalAssets, data_dir: Path) -> TerminalAssets:
    """Make the kernel, initramfs and tools disk readable by rig uids.

    They are built into a cache that may sit in a private home (0700); rigs
    read them from ``<dataDir>/rigs/assets/`` instead, as read-only hard links
    (or copies when the cache is on another filesystem).
    """
    out = data_dir / "rigs" / "assets"
    make_shared_dir(out)
    placed: dict[str, Path] = {}
    for name, src in (("kernel", assets.kernel), ("initrd", assets.initrd), ("tools", assets.tools)):
        digest_dir = out / src.parent.name
        make_shared_dir(digest_dir)
        dst = digest_dir / src.name
        if not dst.exists():
            tmp = dst.with_name(dst.name + ".tmp")
            tmp.unlink(missing_ok=True)
            try:
                os.link(src, tmp)
            except OSError:
                shutil.copyfile(src, tmp)
            os.chmod(tmp, 0o444)
            os.replace(tmp, dst)
        placed[name] = dst
    return TerminalAssets(
        kernel=placed["kernel"], initrd=placed["initrd"], tools=placed["tools"],
        oci_layout=assets.oci_layout, image_digest=assets.image_digest,
        kernel_release=assets.kernel_release,
    )


async def choose_accel(config: ServeConfig, assets: TerminalAssets) -> tuple[Accel | None, str | None]:
    if config.accel is Accel.TCG:
        return Accel.TCG, None
    wanted = config.accel or native_accel()
    if wanted is None:
        return None, "this host has no supported accelerator (kvm on Linux, hvf on macOS)"
    result = await probe(wanted, qemu=config.qemu, kernel=assets.kernel, initrd=assets.initrd)
    if result.ok:
        log.info("accelerator %s works (%s)", wanted, result.detail)
        return wanted, None
    problem = f"{wanted} probe failed: {result.detail}"
    if config.accel is not None:
        raise RigdError(f"--accel {wanted} was asked for, but {problem}")
    return None, problem


def gateway_prefix(data_dir: Path) -> str:
    """Names of this server's network objects start with this (2-4 characters):
    derived from the data directory, so one server's crash recovery never
    touches another server's gateways on the same host."""
    return "r" + hashlib.sha256(str(data_dir).encode()).hexdigest()[:3]


CAP_NET_ADMIN = 12
CAP_SYS_ADMIN = 21
NETWORK_MODES = ("auto", "gateway", "user", "none")


def effective_caps(status: Path = Path("/proc/self/status")) -> int:
    """The process's effective capability set (0 when it cannot be read)."""
    try:
        for line in status.read_text().splitlines():
            if line.startswith("CapEff:"):
                return int(line.split()[1], 16)
    except (OSError, ValueError, IndexError):
        pass
    return 0


def choose_network(requested: str, *, euid: int, caps: int, missing_tools: list[str],
                   qemu_user_net: bool) -> tuple[str | None, str]:
    """The network mode (``"gateway"``, ``"user"`` or None) and why.

    Pure; raises :class:`RigdError` when a forced mode cannot work.

    The rootful gateway needs root with CAP_NET_ADMIN (links, nftables) and
    CAP_SYS_ADMIN (namespaces), and the ``ip`` and ``nft`` tools; user mode
    needs only a QEMU built with user networking (slirp).
    """
    if requested not in NETWORK_MODES:
        raise RigdError(f"--network {requested!r} is not one of {', '.join(NETWORK_MODES)}")
    if requested == "none":
        return None, "--network none"
    lacking = []
    if euid != 0:
        lacking.append("not running as root")
    for bit, name in ((CAP_NET_ADMIN, "CAP_NET_ADMIN"), (CAP_SYS_ADMIN, "CAP_SYS_ADMIN")):
        if not caps >> bit & 1:
            lacking.append(f"no {name}")
    if missing_tools:
        lacking.append(f"missing {', '.join(missing_tools)}")
    if requested == "gateway":
        if lacking:
            raise RigdError("--network gateway cannot work: " + "; ".join(lacking))
        return "gateway", "--network gateway"
    if requested == "user":
        if not qemu_user_net:
            raise RigdError("--network user cannot work: this QEMU has no user networking (slirp)")
        return "user", "--network user"
    if not lacking:
        return "gateway", "root with CAP_NET_ADMIN"
    if qemu_user_net:
        return "user", "; ".join(lacking)
    return None, "; ".join(lacking) + "; and this QEMU has no user networking (slirp)"


async def qemu_has_user_net(qemu: str) -> bool:
    try:
        result = await trio.run_process([qemu, "-netdev", "help"], capture_stdout=True, capture_stderr=True,
                                        check=False)
    except OSError:
        return False
    return "user" in result.stdout.decode("utf-8", "replace").split()


async def _network(config: ServeConfig, data_dir: Path) -> tuple[NetworkConfig | None, SecretStore | None]:
    """A gateway namespace per rig when we may manage namespaces; else QEMU user networking
    (``restrict=on``) relayed to the same proxy; no network only when neither works (said loudly)."""
    if config.network == "none":
        return None, None
    mode, why = choose_network(
        config.network, euid=os.geteuid(), caps=effective_caps(),
        missing_tools=[t for t in ("ip", "nft") if shutil.which(t) is None],
        qemu_user_net=await qemu_has_user_net(config.qemu),
    )
    if mode is None:
        log.warning("rigs get no network: %s", why)
        return None, None
    broker = SecretStore(data_dir)
    common = functools.partial(NetworkConfig, resolver=config.resolver, upstream_netns=config.upstream_netns,
                               broker=broker, upstream_ca=config.upstream_ca)
    if mode == "user":
        try:
            python = helper_python()
        except RuntimeError as exc:
            raise RigdError(f"user-mode networking: {exc}") from exc
        log.warning("rigs get user-mode networking (QEMU slirp, restrict=on, relayed to the egress proxy; "
                    "QEMU's sandbox allows spawn in this mode): %s", why)
        return common(mode="user", helper_python=python), broker
    prefix = gateway_prefix(data_dir)
    removed = await trio.to_thread.run_sync(lambda: cleanup_leftovers(prefix, keep=()))
    if removed.namespaces or removed.links:
        log.info("removed network objects a previous server left: %s", removed)
    log.info("rigs get a gateway namespace each (%s)", why)
    return common(mode="gateway", prefix=prefix), broker


ImageProvider = Callable[[Callable[[str], None]], ImportedImage | None]


def which_boots(data_dir: Path, cache_dir: Path | None) -> BootChoice:
    """The one rule for what computer rigs boot (``desktop_images`` and ``image.list`` share it).

    A desktop build in the cache (``make images-desktop``) that is not imported yet is what
    the next rig boots (it imports it first); otherwise the newest import in
    ``<dataDir>/rigs/images/`` (by its directory's mtime, then its name). Blocking: it reads
    the file system and hashes the build's small manifest.
    """
    imported = list_imported(data_dir)
    try:
        built = find_desktop(cache_dir)
    except RigdError:
        built = None
    if built is not None:
        digest = sha256_file(built.manifest_path)
        if not any(i.sha256 == digest for i in imported):
            return BootChoice(imported, None, (built.manifest_path, digest))
    boots = max(imported, key=lambda i: (i.dir.stat().st_mtime_ns, i.dir.name)) if imported else None
    return BootChoice(imported, boots, None)


def desktop_images(data_dir: Path, cache_dir: Path | None) -> ImageProvider:
    """What computer rigs boot: :func:`which_boots`.

    The desktop recipe's build in the cache (``make images-desktop``) is
    imported on first use, checksum-pinned like any other import, so a rig
    never boots a file that can change under it.
    """

    def current(progress: Callable[[str], None]) -> ImportedImage | None:
        choice = which_boots(data_dir, cache_dir)
        if choice.pending is not None:
            manifest, digest = choice.pending
            progress("importing the desktop image")
            log.info("importing the built desktop image %s", manifest.parent)
            import_image(manifest, digest, data_dir, progress=lambda m: log.info("desktop import: %s", m))
            choice = which_boots(data_dir, cache_dir)
        return choice.boots

    return current


async def _warm_pack(backend: QemuBackend) -> None:
    """Unpack the default image and snapshot a booted machine of the default
    shape now, so the first rig.open neither unpacks nor boots cold."""
    limits = LIMITS[Surface.TERMINAL]
    try:
        await prepare_terminals(backend, limits.memory_mb, limits.vcpus,
                                lambda step: log.info("pack: %s", step))
    except RigdError as exc:
        log.error("could not prepare the terminal pack: %s", exc.message)


def mcp_endpoint(ctx: ServerContext) -> HttpEndpoint:
    """``/mcp``: the agent tools over MCP, each request as its bearer token's caller, through
    the same dispatcher as ``/rpc``."""

    def rpc_for(caller: Caller) -> AsyncRpc:
        return dispatched(functools.partial(ctx.dispatcher.handle, caller))

    return HttpEndpoint(ctx.caller_from_token, rpc_for)


def http_config(host: str, port: int) -> HyperConfig:
    """Hypercorn's settings for rigd's app: the bind and the inbound message limit."""
    hyper = HyperConfig()
    bind_host = f"[{host}]" if ":" in host else host
    hyper.bind = [f"{bind_host}:{port}"]
    hyper.websocket_max_message_size = MAX_INBOUND
    hyper.accesslog = None
    hyper.errorlog = logging.getLogger("rigd.http")
    hyper.graceful_timeout = 2.0
    return hyper


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def lan_address(host: str) -> str:
    """The address a LAN share's URL names: the server's own bind address when it is one, else the
    first global IPv4 address of this host ("" when there is none)."""
    if not is_loopback(host) and host not in ("0.0.0.0", "::", ""):  # noqa: S104 - a comparison
        return host
    with contextlib.suppress(OSError), socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        # No packet is sent: connect() on UDP only picks the source address a route would use.
        probe.connect(("192.0.2.1", 9))
        addr = str(probe.getsockname()[0])
        if not ipaddress.ip_address(addr).is_loopback:
            return addr
    return ""


async def _ports_hub(config: ServeConfig, data_dir: Path) -> PortsHub:
    """Forwards and dev domains: the dev CA is made now (a bad key file stops the server, naming it)."""
    tls = None
    problem: str | None = None
    ca = None
    if config.dev_https_port is not None and config.dev_http_port is not None:
        ca, problem = await trio.to_thread.run_sync(load_dev_ca, tls_dir(data_dir))
        if ca is not None:
            tls = ca.server_context()
    elif config.dev_https_port is None:
        problem = "turned off (--dev-https-port none)"
    lan_allowed = config.allow_lan_ports or not is_loopback(config.host)
    return PortsHub(tls=tls, tls_problem=problem, lan_allowed=lan_allowed,
                    lan_host=lan_address(config.host) if lan_allowed else "",
                    ca_pem=ca.ca_pem if ca is not None else None,
                    ca_fingerprint=ca.fingerprint if ca is not None else None)


async def serve(config: ServeConfig, *, task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED) -> None:
    data_dir = config.data_dir.resolve()
    data_dir.mkdir(parents=True, exist_ok=True)
    os.chmod(data_dir, 0o711)  # noqa: S103 - rig uids traverse, never list
    check_reachable(data_dir)
    # Before anything is started: a bad credentials file stops the server with its reason.
    auth_file = config.registry_auth or data_dir / AUTH_FILE
    credentials: dict[str, Credentials] = {}
    if config.registry_auth is not None or auth_file.exists():
        credentials = await trio.to_thread.run_sync(load_registry_auth, auth_file)
        log.info("registry credentials", extra={"file": str(auth_file), "registries": sorted(credentials)})
    config = dataclasses.replace(config, credentials=credentials)
    stores = Stores(data_dir)
    try:
        await _serve(config, data_dir, stores, task_status)
    finally:
        stores.close()


async def _serve(
    config: ServeConfig, data_dir: Path, stores: Stores, task_status: trio.TaskStatus[str]
) -> None:
    admin, _ws, token = await stores.run(stores.server.bootstrap)
    token_path = data_dir / "admin.token"
    if token is None and not token_path.exists():
        # The hash is all we keep; mint a fresh admin token for the operator.
        token = await stores.run(stores.server.create_token, admin.id, "admin")
    if token is not None:
        write_private(token_path, token + "\n")

    assets = publish_assets(await trio.to_thread.run_sync(find_assets, config.cache_dir), data_dir)
    accel, problem = await choose_accel(config, assets)
    if problem:
        log.warning("no accelerator: %s; rigs cannot open until the server runs with --accel tcg", problem)

    make_pack = functools.partial(readable_pack, assets, data_dir)
    network, broker = await _network(config, data_dir)
    qemu_config = QemuConfig(data_dir=data_dir, accel=accel or Accel.TCG, qemu=config.qemu,
                             warm_starts=config.warm_starts, network=network,
                             tcg_threads=config.tcg_threads or default_tcg_threads())
    if qemu_config.accel is Accel.TCG:
        log.info("TCG rigs run %s-threaded", qemu_config.tcg_threads, extra={"cores": os.cpu_count()})
    # One layout, one uid pool (no two rigs of any surface share a uid), one snapshot service.
    layout = Layout(data_dir)
    uids = UidPool()
    snapshots = SnapshotService(qemu_config, layout, uids)
    events = EventBus(stores)
    pulls = PullJobs(data_dir, RegistryClient(insecure=config.insecure_registries,
                                              credentials=config.credentials), events)
    backend = terminal_backend(qemu_config, assets, make_pack, layout=layout, uids=uids,
                               snapshots=snapshots,
                               custom=functools.partial(custom_pack, data_dir, pulls))
    desktop = desktop_backend(qemu_config, desktop_images(data_dir, config.cache_dir), tools=assets.tools,
                              layout=layout, uids=uids, snapshots=snapshots)
    browser = browser_backend(qemu_config, functools.partial(browser_pack, data_dir, config.cache_dir),
                              layout=layout, uids=uids, snapshots=snapshots, profiles=ProfileStore(data_dir),
                              custom=functools.partial(custom_browser_pack, data_dir, assets, pulls))
    rigs = RigManager(
        stores, {Surface.TERMINAL: backend, Surface.BROWSER: browser, Surface.COMPUTER: desktop},
        accel=accel, accel_problem=problem, events=events,
        recover=layout.recover,
        memory_budget_mb=config.memory_budget_mb, tick_s=config.reap_interval_s,
        network=network.mode if network is not None else None,
        pools=config.pools, pool_max_age_s=config.pool_max_age_s,
    )
    rigs.ports = await _ports_hub(config, data_dir)
    if broker is not None:
        secrets = broker

        async def brokered(workspace_id: str) -> bool:
            return bool(await trio.to_thread.run_sync(secrets.list, workspace_id))

        rigs.brokered = brokered
    signer = Signer(load_or_create_key(data_dir / "signing.key"))
    base_url: list[str] = []
    imports = ImportJobs(data_dir, functools.partial(which_boots, data_dir, config.cache_dir))
    dispatcher = Dispatcher(build_methods(stores, rigs, signer, base_url, broker,
                                          images=imports, pulls=pulls))
    ctx = ServerContext(stores, rigs, dispatcher, signer)
    mcp_http = mcp_endpoint(ctx)
    app = server_app(ctx, mcp_http)

    hyper = http_config(config.host, config.port)

    async with trio.open_nursery() as nursery:
        await nursery.start(snapshots.run)
        await nursery.start(rigs.run)
        await nursery.start(imports.run)
        await nursery.start(pulls.run)
        await nursery.start(mcp_http.run)
        await nursery.start(rigs.ports.run, config.dev_http_port, config.dev_https_port)
        if accel is not None:
            # Unpack the default image now, so the first rig.open does not wait for it.
            nursery.start_soon(_warm_pack, backend)
        shutdown = trio.Event()

        async def on_signals() -> None:
            with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
                async for sig in signals:
                    log.info("received %s; closing every rig", signal.Signals(sig).name)
                    shutdown.set()
                    return

        nursery.start_soon(on_signals)
        serve_http = functools.partial(hyper_serve, app, hyper, shutdown_trigger=shutdown.wait)
        binds = await nursery.start(serve_http)
        url = str(binds[0])
        base_url.append(url)
        write_private(data_dir / "server.json", json.dumps({"url": url}) + "\n")
        os.chmod(data_dir / "server.json", 0o644)
        task_status.started(url)
        print(f"rigd {url} (data {data_dir}, accel {accel or 'none: ' + (problem or '')})", flush=True)
        print(f"admin token: {token_path}", flush=True)
        print(f"settings page: {url}{PAGE_HOME} (sign in with the admin token)", flush=True)
        if rigs.ports.dev_http_port is not None:
            https = (f", https on {rigs.ports.dev_https_port} (trust `rigd ca`)"
                     if rigs.ports.dev_https_port is not None else f" (no https: {rigs.ports.tls_problem})")
            print(f"dev domains: http on 127.0.0.1:{rigs.ports.dev_http_port}{https}", flush=True)
        await shutdown.wait()
        await rigs.shutdown()
        nursery.cancel_scope.cancel()
