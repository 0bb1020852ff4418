"""The live view: ``/rig/live/<rigId>`` (WebSocket) — frames out, a person's input in.

Authentication: a signed ``rig-view:<workspaceId>/<rigId>`` target (from
``rig.viewUrl``) or a bearer token, plus membership. A ``rig-view``
signature verifies nowhere else (targets are part of the MAC), so a URL
handed out to *watch* cannot open a terminal or write files.

Server → client:

- a text frame ``{"type": "frame", "seq": N, "display": {"width", "height"},
  "imageSize": {...}, "scale": s, "mediaType": "image/jpeg", "bytes": n}``
  immediately followed by one binary frame with the image (the pair is
  written under the socket's one send lock, so a pong or an error never lands
  between them), whenever the screen changed (frames up to 2560x1600 — a person's view is not capped at
  the agent's 1280x800). ``source`` names the lane (``agent`` or ``qmp``);
  ``trigger`` why it was grabbed (``open``, ``damage``, ``pointer``, ``poll``);
  ``grabs`` the view's grabs so far; ``lane`` ``{source, why, measuredMs}``
  the lane the machine measured fastest. The pointer is marked in every
  frame; nothing else is drawn on it;
- ``{"type": "hello", "control": bool, ...}`` first, and
  ``{"type": "error", "field"?, "reason"}`` for refused input.

Client → server (text frames, JSON): ``{"type": "move", "x", "y"}``,
``{"type": "button", "button": "left|right|middle", "down": bool, "x"?, "y"?}``,
``{"type": "wheel", "direction": "up|down|left|right", "amount"?: 1..20}``,
``{"type": "key", "key": "<X11 keysym>", "down": bool}``,
``{"type": "text", "text": "..."}`` (typed as the ``type`` verb types: every
character through QMP, those outside the US map on spare keys the agent
binds; an image whose agent cannot bind keys refuses them, naming ``text``), and
``{"type": "ping"}``. Input is accepted only from the person holding the
rig's control lease (``rig.control take``); anyone else is view-only and gets
an error naming ``control``. Input goes through the same QMP path as the
agent's verbs and is audited by shape (pointer coordinates, key up/down
counts; never key names or text).

While the socket is open the rig is watched (pinned: never parked or
idle-reaped) and a parked rig is woken.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from collections.abc import AsyncGenerator, Callable
from typing import Any, NamedTuple

import trio
from quart import websocket

from rigd.backends.base import Machine
from rigd.errors import FieldError, RigdError
from rigd.frames import Lane, LiveScreen, Still
from rigd.model import HUMAN_STILL_MAX
from rigd.protocols import input as qin
from rigd.server.app import ServerContext, json_response, lane_caller, lane_refusal
from rigd.server.wsio import LockedSender
from rigd.verbs.masking import mask

#: The fastest a view with change notices grabs (30 fps); a grab itself takes
#: ~40 ms on the host lane, ~0.6 s on the agent's, under TCG on a 2-core host.
MIN_FRAME_INTERVAL_S = 1 / 30
#: The fastest the view polls a screen without change notices.
POLL_INTERVAL_S = 0.05
#: How long an unchanged screen is re-checked (polling only).
IDLE_INTERVAL_S = 0.25
#: A change watch that ends within this long of opening, this many times in a row,
#: is given up for the view's life: it polls instead.
WATCH_SHORT_S = 5.0
WATCH_RETRIES = 3
LIVE_QUALITY = 70
MAX_TEXT = 4096


async def serve_live(ctx: ServerContext, rig_id: str) -> Any:
    try:
        caller = await lane_caller(ctx, "rig-view", rig_id)
        rig = await ctx.rigs.view_rig(caller, rig_id)
    except RigdError as exc:
        return lane_refusal(exc)
    machine = rig.machine
    display = None if machine is None else machine.display
    if machine is None or display is None:
        return json_response({"error": {"message": "only rigs with a screen have a live view"}}, 409)
    await websocket.accept()
    # Frames come from one task, pongs and errors from the reader: one send lock.
    out = LockedSender(websocket.send)
    counts: dict[str, int] = {"frames": 0, "inputs": 0, "refused": 0}
    await ctx.rigs.audit_event(rig, caller, "view_open", {})
    await out.send_json({
        "type": "hello", "rigId": rig_id, "control": rig.person_controller == caller.user.id,
        "display": {"width": display[0], "height": display[1]},
    })
    try:
        async with trio.open_nursery() as nursery:

            async def frames() -> None:
                live = changed_frames(machine, lambda: ctx.rigs.keep_watched(rig))
                async with contextlib.aclosing(live):
                    async for frame in live:
                        still = frame.still
                        counts["frames"] += 1
                        await out.send_json({
                            "type": "frame", "seq": counts["frames"], "source": frame.source,
                            "display": {"width": still.display_w, "height": still.display_h},
                            "imageSize": {"width": still.image_w, "height": still.image_h},
                            "scale": round(still.scale, 6), "mediaType": still.media_type,
                            "bytes": len(still.data), **frame_fields(frame),
                        }, still.data)

            nursery.start_soon(frames)
            while True:
                message = await websocket.receive()
                ctx.rigs.keep_watched(rig)
                try:
                    msg = json.loads(message) if isinstance(message, str) else None
                    if not isinstance(msg, dict):
                        raise FieldError("message", "must be a JSON object in a text frame")
                    if msg.get("type") == "ping":
                        await out.send_json({"type": "pong"})
                        continue
                    if rig.person_controller != caller.user.id:
                        counts["refused"] += 1
                        raise FieldError("control", "view-only: take control of the rig "
                                                    "(rig.control take) before sending input")
                    plan, shape = plan_input(msg, machine.display or display)
                    await ctx.rigs.live_input(rig, caller, machine, plan, shape)
                    counts["inputs"] += 1
                except RigdError as exc:
                    await out.send_json({"type": "error", **exc.to_json().get("data", {}),
                                         "reason": exc.message})
    finally:
        with trio.CancelScope(shield=True):
            await ctx.rigs.audit_event(rig, caller, "view_close", dict(counts))
    return None


class LiveFrame(NamedTuple):
    """One frame of a live view and how it came."""

    still: Still
    #: The lane: "agent" (the in-guest grab) or "qmp" (QMP screendump, encoded on the host).
    source: str
    #: Why it was grabbed: "open" (the view's first), "damage" (the agent's notice),
    #: "pointer" (the host moved it), "damage+pointer", or "poll" (no notices: an older agent).
    trigger: str
    #: Grabs made by this view so far (an idle screen adds none).
    grabs: int
    #: Which lane and why (what was measured), when the machine chose one.
    lane: Lane | None


async def changed_frames(machine: Machine, tick: Callable[[], None]) -> AsyncGenerator[LiveFrame, None]:
    """Stills of the screen (up to 2560x1600), each yielded only when it changed.

    A machine with change notices (:class:`rigd.frames.LiveScreen`, an agent
    with ``damage``) is grabbed once when the view opens and then only after
    a notice — an idle screen costs no grab — at most every
    ``MIN_FRAME_INTERVAL_S``, from the lane measured fastest. Without notices
    the screen is polled (``IDLE_INTERVAL_S``) as before. ``tick`` is called
    before every grab (the live view keeps the rig watched with it). A grab
    that fails is retried a second later; the view never ends on its own.

    Use it under ``contextlib.aclosing``: leaving ends the agent's watch.
    """
    if not isinstance(machine, LiveScreen):
        async for frame in polled_frames(machine, tick, 0):
            yield frame
        return
    grabs = 0
    short_lived = 0
    while True:
        opened = trio.current_time()
        if short_lived >= WATCH_RETRIES:
            # The watch keeps ending at once (an X server without DAMAGE refuses it): poll.
            async for frame in polled_frames(machine, tick, grabs):
                yield frame
            return
        async with machine.open_changes() as changes:
            if changes is None:
                async for frame in polled_frames(machine, tick, grabs):
                    yield frame
                return
            last = b""
            trigger = "open"
            while True:
                tick()
                t0 = trio.current_time()
                try:
                    got, lane = await machine.live_still(
                        max_w=HUMAN_STILL_MAX.width, max_h=HUMAN_STILL_MAX.height, quality=LIVE_QUALITY)
                except RigdError:
                    await trio.sleep(1.0)
                    changes.pointer()  # try again: the screen may have changed meanwhile
                    trigger = "retry"
                else:
                    grabs += 1
                    digest = hashlib.sha256(got.still.data).digest()
                    if digest != last:
                        last = digest
                        yield LiveFrame(got.still, got.source, trigger, grabs, lane)
                    # A cap on the rate, after a grab only: notices that come
                    # meanwhile are gathered into the next grab.
                    await trio.sleep(max(0.0, MIN_FRAME_INTERVAL_S - (trio.current_time() - t0)))
                change = await changes.wait()
                if change is None:
                    break  # the watch ended (agent or X restarted): open another
                trigger = "+".join(sorted(change.why))
        short_lived = short_lived + 1 if trio.current_time() - opened < WATCH_SHORT_S else 0
        await trio.sleep(1.0)


async def polled_frames(
    machine: Machine, tick: Callable[[], None], grabs: int
) -> AsyncGenerator[LiveFrame, None]:
    """The screen polled (agents without change notices: older images; the
    loop every view ran before them, kept as the bench's "before" peer)."""
    last = b""
    while True:
        tick()
        t0 = trio.current_time()
        try:
            still, source, _cursor, _marked = await machine.still(
                max_w=HUMAN_STILL_MAX.width, max_h=HUMAN_STILL_MAX.height, quality=LIVE_QUALITY,
            )
        except RigdError:
            await trio.sleep(1.0)
            continue
        grabs += 1
        digest = hashlib.sha256(still.data).digest()
        if digest == last:
            await trio.sleep(IDLE_INTERVAL_S)
            continue
        last = digest
        yield LiveFrame(still, source, "poll", grabs, None)
        await trio.sleep(max(0.0, POLL_INTERVAL_S - (trio.current_time() - t0)))


def frame_fields(frame: LiveFrame) -> dict[str, Any]:
    """What a frame message says beyond the image: why it came, how many grabs
    the view has made, and the lane and why (its measured cost)."""
    out: dict[str, Any] = {"trigger": frame.trigger, "grabs": frame.grabs}
    if frame.lane is not None:
        out["lane"] = {"source": frame.lane.source, "why": frame.lane.why,
                       "measuredMs": dict(frame.lane.measured_ms)}
    return out


def _int(msg: dict[str, Any], name: str, lo: int, hi: int) -> int:
    value = msg.get(name)
    if not isinstance(value, int) or isinstance(value, bool) or not lo <= value <= hi:
        raise FieldError(name, f"must be an integer between {lo} and {hi}")
    return value


def plan_input(msg: dict[str, Any], display: tuple[int, int]) -> tuple[list[qin.Step], dict[str, Any]]:
    """A live-view input message → (QMP plan, what the audit log records). Pure."""
    kind = msg.get("type")
    w, h = display
    if kind == "move":
        x, y = _int(msg, "x", 0, w - 1), _int(msg, "y", 0, h - 1)
        return [qin.move(x, y, w, h)], {"type": "move", "x": x, "y": y}
    if kind == "button":
        name = msg.get("button")
        if name not in qin.BUTTONS:
            raise FieldError("button", "must be left, right or middle")
        down = msg.get("down")
        if not isinstance(down, bool):
            raise FieldError("down", "must be true or false")
        plan: list[qin.Step] = []
        shape: dict[str, Any] = {"type": "button", "button": name, "down": down}
        if "x" in msg or "y" in msg:
            x, y = _int(msg, "x", 0, w - 1), _int(msg, "y", 0, h - 1)
            plan.append(qin.move(x, y, w, h))
            shape.update(x=x, y=y)
        plan.append([qin.button(str(name), down)])
        return plan, shape
    if kind == "wheel":
        direction = msg.get("direction")
        if direction not in qin.WHEEL:
            raise FieldError("direction", "must be up, down, left or right")
        amount = _int(msg, "amount", 1, 20) if "amount" in msg else 1
        return qin.plan_scroll(None, display, str(direction), amount), {
            "type": "wheel", "direction": direction, "amount": amount}
    if kind == "key":
        key = msg.get("key")
        down = msg.get("down")
        if not isinstance(down, bool):
            raise FieldError("down", "must be true or false")
        if not isinstance(key, str):
            raise FieldError("key", "must be an X11 keysym name")
        try:
            qcode, _shift = qin.qcode_of(key)
        except qin.UnknownKey as exc:
            raise FieldError("key", str(exc)) from exc
        event = {"type": "key", "data": {"down": down, "key": {"type": "qcode", "data": qcode}}}
        return [[event]], {"type": "key", "down": down}
    if kind == "text":
        text = msg.get("text")
        if not isinstance(text, str) or not text or len(text) > MAX_TEXT:
            raise FieldError("text", f"must be 1-{MAX_TEXT} characters")
        # Planned by the machine when it sends it, against its key bindings
        # (characters outside the US map go on spare keys the agent binds).
        return [qin.Text(text)], {"type": "text", "text": mask(text)}
    raise FieldError("type", "must be move, button, wheel, key, text or ping")


__all__ = ["LiveFrame", "changed_frames", "frame_fields", "plan_input", "polled_frames", "serve_live"]
