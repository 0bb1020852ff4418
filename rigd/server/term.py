"""The interactive terminal lane: ``/rig/term/<rigId>`` (WebSocket).

Client → server: binary frames are keystrokes; text frames are JSON control
messages ``{"type": "resize", "cols": 120, "rows": 40}`` or
``{"type": "input", "data": "ls\\n"}``. Server → client: binary frames of
terminal output, then one text frame ``{"type": "exit", ...}`` before closing.

What a person types is input to the rig, so the session is audited — by shape
only: the open and close are logged with byte counts, never the keystrokes.
While a terminal is open the rig is pinned (RIGS.md §7).
"""

from __future__ import annotations

import json
from typing import Any

import trio
from quart import websocket

from rigd.errors import FieldError, RigdError
from rigd.server.app import ServerContext, lane_caller, lane_refusal
from rigd.server.wsio import LockedSender

MAX_COLS = 1000
MAX_ROWS = 1000


def _size(msg: dict[str, Any]) -> tuple[int, int]:
    cols, rows = msg.get("cols"), msg.get("rows")
    for name, value, hi in (("cols", cols, MAX_COLS), ("rows", rows, MAX_ROWS)):
        if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= hi:
            raise FieldError(name, f"must be an integer between 1 and {hi}")
    assert isinstance(cols, int) and isinstance(rows, int)
    return cols, rows


async def serve_terminal(ctx: ServerContext, rig_id: str) -> Any:
    try:
        caller = await lane_caller(ctx, "rig-term", rig_id)
        rig = await ctx.rigs.terminal_rig(caller, rig_id)
    except RigdError as exc:
        return lane_refusal(exc)
    machine = rig.machine
    assert machine is not None
    await websocket.accept()
    # Output and exit come from the pump, errors from the reader: one send lock.
    out = LockedSender(websocket.send)
    cols, rows = 80, 24
    try:
        cols = int(websocket.args.get("cols", "80"))
        rows = int(websocket.args.get("rows", "24"))
        cols, rows = _size({"cols": cols, "rows": rows})
    except (ValueError, FieldError):
        cols, rows = 80, 24
    counts = {"inputBytes": 0, "outputBytes": 0, "inputChunks": 0}
    await ctx.rigs.audit_event(rig, caller, "terminal_open", {"cols": cols, "rows": rows})
    rig.terminals += 1
    logged_close = False

    async def log_close() -> None:
        nonlocal logged_close
        if not logged_close:
            logged_close = True
            await ctx.rigs.audit_event(rig, caller, "terminal_close", counts)

    try:
        async with machine.open_pty(cols=cols, rows=rows) as pty, trio.open_nursery() as nursery:

            async def pump_out() -> None:
                async for chunk in pty.output():
                    counts["outputBytes"] += len(chunk)
                    await out.send(chunk)
                status = pty.exit_status or {}
                # On record before the person sees the session end.
                await log_close()
                await out.send_json({"type": "exit", **status})
                nursery.cancel_scope.cancel()

            nursery.start_soon(pump_out)
            while True:
                message = await websocket.receive()
                if isinstance(message, bytes):
                    data = message
                else:
                    try:
                        msg = json.loads(message)
                        if not isinstance(msg, dict):
                            raise ValueError
                    except ValueError:
                        await out.send_json({"type": "error", "field": "message",
                                             "reason": "must be a JSON object"})
                        continue
                    if msg.get("type") == "resize":
                        try:
                            await pty.resize(*_size(msg))
                        except FieldError as exc:
                            await out.send_json({"type": "error", **exc.data})
                        continue
                    if msg.get("type") == "input" and isinstance(msg.get("data"), str):
                        data = msg["data"].encode()
                    else:
                        await out.send_json({
                            "type": "error", "field": "type",
                            "reason": "must be 'input' (with data) or 'resize' (with cols, rows)",
                        })
                        continue
                counts["inputBytes"] += len(data)
                counts["inputChunks"] += 1
                ctx.rigs.note_activity(rig)
                await pty.write(data)
    except RigdError as exc:
        with trio.move_on_after(2):
            await out.send_json({"type": "error", "reason": exc.message})
    finally:
        rig.terminals -= 1
        with trio.CancelScope(shield=True):
            await log_close()
    return None
