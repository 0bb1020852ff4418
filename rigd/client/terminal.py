"""``rigd term``: attach this terminal to a rig's PTY over ``/rig/term/<rigId>``.

A CLI is not a server: the blocking websockets client and a thread for the
keyboard keep this simple, and no event loop is involved.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
import termios
import threading
import tty
from types import FrameType

from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect


def run_terminal(url: str) -> int:
    cols, rows = shutil.get_terminal_size()
    sep = "&" if "?" in url else "?"
    status: dict[str, object] = {}
    with connect(f"{url}{sep}cols={cols}&rows={rows}", max_size=2**20) as ws:
        interactive = sys.stdin.isatty()
        saved = termios.tcgetattr(sys.stdin) if interactive else None

        def on_winch(_sig: int, _frame: FrameType | None) -> None:
            c, r = shutil.get_terminal_size()
            ws.send(json.dumps({"type": "resize", "cols": c, "rows": r}))

        def keyboard() -> None:
            try:
                while True:
                    data = os.read(sys.stdin.fileno(), 4096)
                    if not data:
                        return
                    ws.send(data)
            except (OSError, ConnectionClosed):
                return

        try:
            if interactive:
                tty.setraw(sys.stdin)
                signal.signal(signal.SIGWINCH, on_winch)
            threading.Thread(target=keyboard, daemon=True).start()
            for message in ws:
                if isinstance(message, bytes):
                    sys.stdout.buffer.write(message)
                    sys.stdout.flush()
                else:
                    msg = json.loads(message)
                    if msg.get("type") == "exit":
                        status = msg
                        break
                    if msg.get("type") == "error":
                        print(f"\r\nrigd: {msg.get('reason')}\r", file=sys.stderr)
        except ConnectionClosed:
            pass
        finally:
            if saved is not None:
                termios.tcsetattr(sys.stdin, termios.TCSADRAIN, saved)
    code = status.get("exitCode")
    return code if isinstance(code, int) else 0
