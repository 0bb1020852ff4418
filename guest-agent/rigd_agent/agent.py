"""The agent: every concern's ops on one channel (docs/guest-protocol.md).

:class:`Agent` is :class:`rigd_agent.core.AgentCore` (the channel, dispatch, hello, reseed,
shutdown) with the ops of each concern mixed in: processes and PTYs
(:mod:`rigd_agent.ops_process`), files (:mod:`rigd_agent.ops_files`), the desktop's screen,
display, keymap and damage (:mod:`rigd_agent.ops_screen`) and its clipboard
(:mod:`rigd_agent.ops_clipboard`). Which op runs inline on the reader thread and which on a
thread of its own is said once, here.
"""

from __future__ import annotations

from rigd_agent.channel import Channel
from rigd_agent.desktop import Desktop
from rigd_agent.ops_clipboard import ClipboardOps
from rigd_agent.ops_files import FileOps
from rigd_agent.ops_process import ProcessOps
from rigd_agent.ops_screen import ScreenOps


class Agent(ProcessOps, FileOps, ScreenOps, ClipboardOps):
    def __init__(self, chan: Channel, *, may_set_clock: bool, may_power_off: bool, sysroot: str | None = None,
                 desktop: Desktop | None = None) -> None:
        super().__init__(chan, may_set_clock=may_set_clock, may_power_off=may_power_off, sysroot=sysroot,
                         desktop=desktop)
        self.inline = {
            "ping": self.op_ping,
            "hello": self.op_hello,
            "reseed": self.op_reseed,
            "pty_in": self.op_pty_in,
            "pty_resize": self.op_pty_resize,
            # files: the writes of a drop must keep their order; acks must never wait
            "file_put_open": self.op_file_put_open,
            "file_put_data": self.op_file_put_data,
            "file_commit": self.op_file_commit,
            "file_abort": self.op_file_abort,
            "file_ack": self.op_file_ack,
            "file_read_cancel": self.op_file_read_cancel,
            "damage_stop": self.op_damage_stop,
        }
        self.threaded = {
            "exec": self.op_exec,
            "pty_open": self.op_pty_open,
            "pty_close": self.op_pty_close,
            "shutdown": self.op_shutdown,
            "file_put_close": self.op_file_put_close,  # fsync
            "file_read": self.op_file_read,
            # protocol 2: they talk to the X server or run xrandr/xclip, so they may block
            "screen": self.op_screen,
            "screenshot": self.op_screen,
            "cursor": self.op_cursor,
            "display": self.op_display,
            "set_display": self.op_set_display,
            "clipboard_read": self.op_clipboard_read,
            "clipboard_write": self.op_clipboard_write,
            "keymap_bind": self.op_keymap_bind,
            "damage_watch": self.op_damage_watch,
        }


__all__ = ["Agent"]
