"""rigd in-guest agent, wire protocols 1 and 2 (see docs/guest-protocol.md).

A package, one module per concern (:mod:`~rigd_agent.channel`, :mod:`~rigd_agent.core`,
:mod:`~rigd_agent.ops_process`, :mod:`~rigd_agent.ops_files`, :mod:`~rigd_agent.desktop`,
:mod:`~rigd_agent.ops_screen`, :mod:`~rigd_agent.ops_clipboard`, :mod:`~rigd_agent.mux` for
ports), shipped on the tools disk as one zipapp (``rigd_agent.pyz``, built with the disk by
:mod:`rigd.images.agent_app`) that ``python3 -I`` runs.

How this works
--------------
The agent reads one JSON request per line from its channel (a virtio-serial
port in a guest, stdin/stdout in tests), answers each with one final reply
line, and may stream events for a request before that reply.  Every request
that can block (exec, pty_open, pty_close, shutdown, file_read, …) runs on
its own thread; quick ones (ping, hello, pty_in, pty_resize, the file_put_*
writes, file_ack) run inline on the reader thread so their order is kept.
All writers share one lock on the channel, so lines never interleave.

Files travel in both protocols: a drop is written to a temporary file,
verified against the host's sha256 and only then linked under a name that
was free (never over an existing file); a read is hashed, then streamed
under the host's credit (``file_ack``).

It runs from a read-only tools disk with its own interpreter and libc, inside
an image we know nothing about: it uses only the Python 3.11 standard
library, and every child it starts gets a clean environment (never the
interpreter's PYTHONHOME or library path) so the child runs on the image's
own libc.

In ``--pid1`` mode the process is the guest's init: it forks, the parent
stays PID 1, reaps every child forever and restarts the agent child when it
dies; the child runs the agent.  PID 1 must never exit (the kernel panics),
so its loop swallows every error.

The host is trusted, but lines can arrive garbled: nothing a line contains
may crash the agent.  Every line read is capped at 1 MiB.
"""
