"""Browser rigs against their named peers, measured in one run (``make bench``).

A browser rig of ``--engine`` (``chromium``, the default, ``firefox`` or ``webkit``) is
booted in-process by the real recipe and driver
(:class:`rigd.backends.browser.BrowserRecipe`, :class:`QemuMachine`: the rig's
own DevTools port, the in-guest relays, the engine's client); the peer is the
same engine package on the host, driven by the same client and driver:
Chromium (``/usr/bin/chromium --headless=new``, DevTools on host loopback)
over CDP, or Firefox ESR (``firefox-esr --headless``, its remote agent on
host loopback) over WebDriver BiDi, or WebKit (``WebKitWebDriver`` on an Xvfb display, host
loopback) over WebDriver classic. Both load the same
pages from a loopback HTTP server on their own side (the host's from a thread
here, the rig's from a tiny socat server inside the guest), so the network is
not what is measured.

(1) **Cold open → first screenshot**: QEMU start to the driver ready, plus
    the first ``screenshot`` verb. Warm starts (issue 12's goal: at least 5 times
    faster than cold) are not built for browser rigs yet: printed as not measured.
(2) **Navigate + screenshot** (the VM tax): the median of ``--rounds``
    rounds of ``navigate`` to a page then ``screenshot`` (1280x800 JPEG), in
    the rig and on the host. Ratio rig / host (1.0 = no tax).
(3) **Live-view fps** while a page animates (``requestAnimationFrame``
    moving a box): frames per second the live view's frame loop yields for
    the rig (:func:`rigd.server.live.changed_frames` over the driver's
    lane). Chromium: over its screencast, against Chromium's own screencast
    on the host (every ``Page.screencastFrame``, acked at once). Firefox (BiDi
    has no screencast): over the driver's polled lane (at most
    :data:`rigd.backends.browser.POLL_FPS` a second), against the host
    Firefox's own capture loop (back-to-back ``capture()``: the most a poller
    could get). Ratio rig / host.
(4) **The screenshot verb against the engine's own capture**, in the same rig, interleaved
    (issue 28, item 3): ``screenshot`` through the machine (parse, driver, answer) against
    the engine's capture call at the same size and quality (``PageDriver.capture``: one
    ``Page.captureScreenshot``, ``browsingContext.captureScreenshot`` or WebDriver
    screenshot). Ratio verb / capture (goal <= 1.0: the verb adds nothing the engine does not).

Under TCG (this host) the rig's CPU is emulated: the ratios say what the
isolation costs here, not on KVM. Every process is killed by pid on the way
out (QEMU by its machine's teardown, the host's engine by process group).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import shlex
import shutil
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import trio

REPO = Path(__file__).resolve().parent.parent
# The checkout first, before this script's own directory, even when PYTHONPATH names it already
# (else bench/netgate.py shadows the netgate package).
with contextlib.suppress(ValueError):
    sys.path.remove(str(REPO))
sys.path.insert(0, str(REPO))

from bench._common import fmt_ms, fmt_s, med  # noqa: E402
from rigd.backends.base import MachineSpec  # noqa: E402
from rigd.backends.browser import (  # noqa: E402
    CAST_QUALITY,
    IMAGE_ENGINE,
    IMAGE_ENGINE_KEY,
    BrowserDriver,
    BrowserRecipe,
)
from rigd.backends.confine import Identity  # noqa: E402
from rigd.backends.qemu import QemuConfig, QemuMachine, make_overlay, open_qemu_machine  # noqa: E402
from rigd.backends.recipe import RigPaths  # noqa: E402
from rigd.browser.cdp import open_cdp  # noqa: E402
from rigd.browser.chromium import ChromiumDriver, open_chromium  # noqa: E402
from rigd.browser.firefox import open_firefox  # noqa: E402
from rigd.browser.page import POLL_FPS, PageDriver  # noqa: E402
from rigd.browser.testing import (  # noqa: E402
    HostChromium,
    serve_pages,
    start_host_chromium,
    start_host_firefox,
    start_host_webkit,
    static_pages,
    stop_host_chromium,
)
from rigd.browser.webdriver import WebDriverConnection  # noqa: E402
from rigd.browser.webkit import open_webkit  # noqa: E402
from rigd.images.browser import BrowserAssets, Engine, build_browser, ensure_browser_pack  # noqa: E402
from rigd.model import AGENT_STILL_MAX, HUMAN_STILL_MAX, Accel, Display, Surface  # noqa: E402
from rigd.model import Engine as ApiEngine  # noqa: E402
from rigd.protocols.bidi import BiDiProtocol  # noqa: E402
from rigd.protocols.devtools import parse_cast_frame  # noqa: E402
from rigd.server.live import changed_frames  # noqa: E402
from rigd.verbs import Action, ParseContext, parse_action  # noqa: E402

#: Where the pack is made (shared with the tests' packs by default: a pack is ~1 GB and minutes to make).
PACKS = Path(os.environ.get("RIGD_BENCH_PACKS", "/var/tmp/rigd-test-packs"))

PAGES = {
    "/page.html": """<!doctype html><html><head><meta charset="utf-8"><title>bench page</title></head>
<body style="font: 16px sans-serif"><h1>A page to load</h1>""" + "<p>lorem ipsum dolor sit amet</p>" * 200
    + "</body></html>",
    "/anim.html": """<!doctype html><html><head><meta charset="utf-8"><title>anim</title></head>
<body style="margin: 0"><div id="box" style="position: absolute; width: 120px; height: 120px;
background: rgb(200, 30, 30)"></div><script>let t = 0; function step() { t += 1;
const b = document.getElementById('box'); b.style.left = (t * 7 % 1100) + 'px';
b.style.top = (t * 3 % 600) + 'px'; b.style.background = 'rgb(' + (t % 255) + ', 60, 160)';
requestAnimationFrame(step); } requestAnimationFrame(step);</script></body></html>""",
}

HANDLER = r"""#!/bin/sh
read -r method path proto
while read -r line; do [ "$(printf %s "$line" | tr -d '\r')" = "" ] && break; done
f="/srv${path%%\?*}"
if [ -f "$f" ]; then
  n=$(wc -c <"$f")
  printf 'HTTP/1.0 200 OK\r\nContent-Type: text/html; charset=utf-8\r\nContent-Length: %s\r\n\r\n' "$n"
  cat "$f"
else
  printf 'HTTP/1.0 404 Not Found\r\nContent-Length: 0\r\n\r\n'
fi
"""

CTX = ParseContext(surface=Surface.BROWSER, display=Display(1280, 800))


@dataclass(frozen=True, slots=True)
class Peer:
    """What differs between engines: how the host's engine starts and is driven, and the
    words the printed lines use for its parts."""

    start: Callable[[Path], HostChromium]
    #: ``cdp``, ``bidi`` (WebDriver BiDi, a fresh protocol per connection) or ``webdriver`` (classic).
    wire: str
    open_page: Callable[..., AbstractAsyncContextManager[PageDriver]]
    #: What answered once the engine had started (line 1).
    agent: str
    #: What line 3 measures, the rig's own frame source and the host's, named.
    live: str
    raw: str
    peer: str


PEERS = {
    Engine.CHROMIUM: Peer(start_host_chromium, "cdp", open_chromium, "DevTools", "screencast",
                          "the rig's raw screencast", "host chromium"),
    Engine.FIREFOX_ESR: Peer(start_host_firefox, "bidi", open_firefox, "its remote agent",
                             f"live view (polled, at most {POLL_FPS} fps)",
                             "the rig's own capture loop",
                             "host firefox-esr capture loop "
                             "(back-to-back capture(): the most a poller could get)"),
    Engine.WEBKIT: Peer(start_host_webkit, "webdriver", open_webkit, "WebKitWebDriver",
                        f"live view (polled, at most {POLL_FPS} fps)",
                        "the rig's own capture loop",
                        "host WebKitWebDriver capture loop "
                        "(back-to-back capture(): the most a poller could get)"),
}


def act(raw: dict[str, Any]) -> Action:
    parsed = parse_action("browser_use", raw, CTX)
    if isinstance(parsed, Exception):
        raise parsed
    return parsed


@contextlib.asynccontextmanager
async def host_engine(peer: Peer, home: Path) -> AsyncIterator[PageDriver]:
    """The peer: the host's engine, headless, its own profile, killed by process group."""
    host = await trio.to_thread.run_sync(peer.start, home)
    try:
        if peer.wire == "webdriver":
            authority = host.ws_url.removeprefix("http://")
            name, _, port = authority.partition(":")
            wd = WebDriverConnection(await trio.open_tcp_stream(name, int(port)), host=authority)
            try:
                async with peer.open_page(wd, viewport=Display(1280, 800)) as page:
                    yield page
            finally:
                await wd.aclose()
            return
        async with (open_cdp(host.ws_url, protocol=BiDiProtocol() if peer.wire == "bidi" else None) as conn,
                    peer.open_page(conn, viewport=Display(1280, 800)) as page):
            yield page
    finally:
        await trio.to_thread.run_sync(stop_host_chromium, host)


async def navigate_and_shoot(perform: Any, site: str, rounds: int) -> list[float]:
    times = []
    for i in range(rounds + 1):
        t0 = time.perf_counter()
        await perform(act({"action": "navigate", "url": f"{site}/page.html?i={i}"}))
        await perform(act({"action": "screenshot"}))
        if i:  # the first round warms the engine's caches of the page's resources
            times.append(time.perf_counter() - t0)
    return times


async def verb_vs_capture(machine: QemuMachine, page: PageDriver,
                          rounds: int) -> tuple[list[float], list[float]]:
    """(4): the ``screenshot`` verb and the engine's capture, alternately, the same page."""
    verb: list[float] = []
    raw: list[float] = []
    for i in range(rounds + 1):
        for side in (("verb", "raw") if i % 2 == 0 else ("raw", "verb")):
            t0 = time.perf_counter()
            if side == "verb":
                await machine.perform(act({"action": "screenshot"}))
            else:
                await page.capture(max_w=AGENT_STILL_MAX.width, max_h=AGENT_STILL_MAX.height, quality=75)
            if i:  # the first round warms both paths
                (verb if side == "verb" else raw).append(time.perf_counter() - t0)
    return verb, raw


async def raw_cast_fps(page: ChromiumDriver, seconds: float) -> tuple[float, int]:
    """Chromium's own screencast: every frame counted and acked at once."""
    frames = 0
    with page.page.subscribe({"Page.screencastFrame"}, limit=16) as sub:
        await page.page.send("Page.startScreencast", {"format": "jpeg", "quality": 70, "everyNthFrame": 1})
        t0 = trio.current_time()
        with trio.move_on_after(seconds):
            while True:
                frame = parse_cast_frame((await sub.receive()).params)
                await page.page.send("Page.screencastFrameAck", {"sessionId": frame.ack})
                frames += 1
        elapsed = trio.current_time() - t0
        await page.page.send("Page.stopScreencast")
    return frames / elapsed, frames


async def capture_fps(page: PageDriver, seconds: float) -> tuple[float, int]:
    """An engine without a screencast: back-to-back ``capture()`` at the live view's size and
    quality, the most a poller could get."""
    frames = 0
    t0 = trio.current_time()
    with trio.move_on_after(seconds):
        while True:
            await page.capture(max_w=HUMAN_STILL_MAX.width, max_h=HUMAN_STILL_MAX.height,
                               quality=CAST_QUALITY)
            frames += 1
    return frames / (trio.current_time() - t0), frames


async def engine_fps(page: PageDriver, seconds: float) -> tuple[float, int]:
    """The most the engine itself yields: its screencast where it has one, else its capture loop."""
    if isinstance(page, ChromiumDriver):
        return await raw_cast_fps(page, seconds)
    return await capture_fps(page, seconds)


async def live_fps(machine: QemuMachine, seconds: float) -> tuple[float, int]:
    """What the rig's live view yields: its frame loop over the driver's lane (screencast or poll)."""
    frames = 0
    sources: set[str] = set()
    live = changed_frames(machine, lambda: None)
    async with contextlib.aclosing(live):
        t0 = trio.current_time()
        with trio.move_on_after(seconds):
            async for frame in live:
                frames += 1
                sources.add(frame.source)
        elapsed = trio.current_time() - t0
    print(f"    (live-view sources: {', '.join(sorted(sources))})")
    return frames / elapsed, frames


async def run(args: argparse.Namespace, assets: BrowserAssets, pack: Path, work: Path) -> int:
    peer = PEERS[assets.engine]
    config = QemuConfig(data_dir=work, accel=Accel.TCG, warm_starts=False)
    recipe = BrowserRecipe(config, assets, pack)
    rig_dir = work / "rig"
    paths = RigPaths(rig_dir, rig_dir / "disk.qcow2")
    identity = Identity(os.getuid(), os.getgid(), (), per_rig=False)
    await make_overlay(config.qemu_img, paths.overlay, pack, "raw", identity)
    spec = MachineSpec(rig_id="benchbrowser", surface=Surface.BROWSER, memory_mb=2048, vcpus=2,
                       engine=IMAGE_ENGINE_KEY[assets.engine])
    with serve_pages(static_pages(PAGES)) as site:
        async with open_qemu_machine(spec=spec, recipe=recipe, config=config, identity=identity,
                                     paths=paths, gateway=None, log=logging.getLogger("rigd.bench")) as m:
            t0 = time.perf_counter()
            await m.boot(lambda step: None)
            ready_s = time.perf_counter() - t0
            await m.perform(act({"action": "screenshot"}))
            cold_s = time.perf_counter() - t0
            assert isinstance(m.driver, BrowserDriver)
            print(f"(1) cold open → first screenshot: {fmt_s(cold_s)} (driver ready {fmt_s(ready_s)}; "
                  f"{peer.agent} answered {fmt_s(m.driver.devtools_s or 0)} after the engine started)")
            print("    standby and pool opens: bench/open.py (a raw machine here has neither)")
            files = {"handler.sh": HANDLER, **{p.lstrip("/"): body for p, body in PAGES.items()}}
            script = "mkdir -p /srv && " + " && ".join(
                f"printf '%s' {shlex.quote(body)} > /srv/{name}" for name, body in files.items())
            script += (" && chmod 0755 /srv/handler.sh && (setsid socat TCP-LISTEN:8000,bind=127.0.0.1,"
                       "reuseaddr,fork EXEC:/srv/handler.sh </dev/null >/dev/null 2>&1 &) && "
                       "until curl -sf -o /dev/null http://127.0.0.1:8000/page.html; do sleep 0.1; done")
            r = await m.exec(["/bin/sh", "-c", script], cwd="/", env=None, stdin=None, timeout_s=60,
                             max_output=4096)
            if r.exit_code != 0:
                raise RuntimeError(f"the guest's page server did not start: {r.stderr[-500:]!r}")
            async with host_engine(peer, work) as host:
                rig_t = await navigate_and_shoot(m.perform, "http://127.0.0.1:8000", args.rounds)
                host_t = await navigate_and_shoot(host.perform, site, args.rounds)
                print(f"(2) navigate + screenshot, median of {args.rounds}: rig {fmt_ms(med(rig_t))}, "
                      f"host {assets.engine.value} {fmt_ms(med(host_t))} → ratio "
                      f"{med(rig_t) / med(host_t):.2f} "
                      "(the VM tax; 1.0 = none)")
                verb_t, raw_t = await verb_vs_capture(m, m.driver.page_driver(), args.rounds)
                print(f"(4) screenshot verb {fmt_ms(med(verb_t))} against {assets.engine.value}'s own "
                      f"capture {fmt_ms(med(raw_t))}, median of {args.rounds}, interleaved → ratio "
                      f"{med(verb_t) / med(raw_t):.2f} (goal <= 1.0)")
                await m.perform(act({"action": "navigate", "url": "http://127.0.0.1:8000/anim.html"}))
                await host.perform(act({"action": "navigate", "url": f"{site}/anim.html"}))
                rig_fps, rig_n = await live_fps(m, args.seconds)
                # The live view's screencast or poll stops once its last viewer has gone (its task's end).
                with trio.fail_after(10):
                    await m.driver.screencast_stopped()
                raw_fps, _raw_n = await engine_fps(m.driver.page_driver(), args.seconds)
                host_fps, host_n = await engine_fps(host, args.seconds)
                print(f"(3) {peer.live} while a page animates, {args.seconds:g} s each: rig live view "
                      f"{rig_fps:.1f} fps ({rig_n} frames; {peer.raw} {raw_fps:.1f} fps), "
                      f"{peer.peer} {host_fps:.1f} fps ({host_n}) → ratio {rig_fps / host_fps:.2f}")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--engine", choices=[e.value for e in ApiEngine if IMAGE_ENGINE[e] in PEERS],
                        default=ApiEngine.CHROMIUM.value,
                        help="the rig's engine, and the same engine on the host as its peer")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    assets = build_browser(IMAGE_ENGINE[ApiEngine(args.engine)], log=lambda m: print(f"[images] {m}"))
    PACKS.mkdir(parents=True, exist_ok=True)
    pack = ensure_browser_pack(assets, PACKS, lambda step: print(f"[pack] {step}"))
    work = Path(tempfile.mkdtemp(prefix="rigd-bench-browser-", dir="/var/tmp"))
    (work / "rig").mkdir(mode=0o700)
    try:
        return trio.run(run, args, assets, pack, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
