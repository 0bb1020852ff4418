"""Marked stills against plain ones, measured in one run (``make bench``; issue 30).

One ``rigd serve`` (warm starts on, pools off) on a scratch data directory; per surface
(``--surfaces``, default ``browser:chromium,computer``) one rig, a page or window with
widgets on it, then ``--rounds`` interleaved pairs of:

- **plain**: ``screenshot`` (the peer: the same verb, the same rig, no marks);
- **marked**: ``screenshot {marks: true}``: the elements found (a page script on a browser,
  the AT-SPI tree read as the session user on a desktop), the still, the boxes drawn on the
  host.

Printed: the medians, the ratio marked / plain, and how many marks a still carried. What a
marked still costs beyond a plain one is what an agent pays for acting on ids instead of
pixels. Every process is killed by pid on the way out.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import time
from typing import Any

from _common import Server, add_server_args, clean_up, fmt_s, med, scratch_root, start_server
from browser import HANDLER

#: A page with a few dozen widgets (the browser's; a desktop shows its panel and a terminal).
PAGE = ("<!doctype html><title>marks</title>" + "".join(
    f"<button style='margin:8px'>button {i}</button>" for i in range(24))
    + "<input placeholder=name><a href='#'>a link</a>")


def act(srv: Server, rig: str, tool: str, **action: Any) -> dict[str, Any]:
    return dict(srv.client.call("rig.act", {"rigId": rig, "tool": tool, "action": action}))


def measure(srv: Server, surface: str, rounds: int) -> tuple[list[float], list[float], int]:
    kind, _, engine = surface.partition(":")
    params: dict[str, Any] = {"workspace": "default", "surface": kind}
    if engine:
        params["engine"] = engine
    t0 = time.monotonic()
    rig = srv.client.call("rig.open", params)["id"]
    print(f"{surface}: rig {rig} ready in {fmt_s(time.monotonic() - t0)}", flush=True)
    tool = "browser_use" if kind == "browser" else "computer_use"
    if kind == "browser":
        # The page from a tiny socat server on the guest's loopback (bench/browser.py's), so the
        # rig needs no egress.
        script = (f"mkdir -p /srv && printf '%s' {shlex.quote(HANDLER)} >/srv/handler.sh && "
                  f"printf '%s' {shlex.quote(PAGE)} >/srv/page.html && chmod 0755 /srv/handler.sh && "
                  "(setsid socat TCP-LISTEN:8000,bind=127.0.0.1,reuseaddr,fork EXEC:/srv/handler.sh "
                  "</dev/null >/dev/null 2>&1 &) && "
                  "until curl -sf -o /dev/null http://127.0.0.1:8000/page.html; do sleep 0.1; done")
        act(srv, rig, "terminal_use", action="exec", argv=["/bin/sh", "-c", script], timeoutS=60)
        act(srv, rig, tool, action="navigate", url="http://127.0.0.1:8000/page.html")
    else:
        act(srv, rig, "terminal_use", action="exec", command=(
            "setsid -f xfce4-terminal --disable-server >/dev/null 2>&1"), timeoutS=30)
        time.sleep(5)  # the window maps; the bench measures stills, not the terminal's start
    act(srv, rig, tool, action="screenshot")  # the first still warms the lane
    plain: list[float] = []
    marked: list[float] = []
    count = 0
    for _ in range(rounds):
        t = time.monotonic()
        act(srv, rig, tool, action="screenshot")
        plain.append(time.monotonic() - t)
        t = time.monotonic()
        out = act(srv, rig, tool, action="screenshot", marks=True)
        marked.append(time.monotonic() - t)
        count = len(out["marks"])
    srv.client.call("rig.close", {"rigId": rig})
    return plain, marked, count


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--surfaces", default="browser:chromium,computer")
    p.add_argument("--rounds", type=int, default=5)
    add_server_args(p)
    args = p.parse_args(argv)
    root = scratch_root("marks")
    srv: Server | None = None
    rc = 1
    results: list[tuple[str, list[float], list[float], int]] = []
    try:
        srv = start_server(args, "marks", root, warm=True)
        for surface in args.surfaces.split(","):
            results.append((surface, *measure(srv, surface, args.rounds)))
        rc = 0
    finally:
        rc = clean_up(srv, rc, server_log=root / "bench-server.log", data_dir=root, keep=args.keep)
    print()
    print(f"marks bench (accel {args.accel}, {args.rounds} interleaved pairs per surface, medians)")
    for surface, plain, marked, count in results:
        print(f"  {surface:18} plain screenshot {fmt_s(med(plain))}   screenshot {{marks: true}} "
              f"{fmt_s(med(marked))} ({count} marks): {med(marked) / med(plain):.2f}x the plain still")
    load = os.getloadavg()
    print(f"  host: {os.cpu_count()} CPUs, load {load[0]:.2f}/{load[1]:.2f}/{load[2]:.2f}")
    return rc


if __name__ == "__main__":
    sys.exit(main())
