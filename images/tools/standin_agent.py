"""Stand-in for guest-agent/rigd_agent/, used only while that package is absent.

It proves the boot path end to end (tools disk, Python runtime, the agent's
port) and nothing more: it prints the ready line the host waits for, then
reaps orphans as PID 1 must. The image build copies the real agent instead
as soon as guest-agent/rigd_agent/ exists.
"""

import argparse
import os
import signal
import sqlite3
import ssl
import sys
import time

ap = argparse.ArgumentParser()
ap.add_argument("--pid1", action="store_true")
ap.add_argument("--port", default="auto")
args = ap.parse_args()

port = "/dev/virtio-ports/rigd.agent"
for _ in range(100):
    if os.path.exists(port):
        break
    time.sleep(0.01)
with open("/dev/console", "w") as console:
    console.write(
        f"RIGD-AGENT-READY standin python={sys.version.split()[0]} "
        f"port={os.path.exists(port)} ssl={ssl.OPENSSL_VERSION.split()[1]} "
        f"sqlite={sqlite3.sqlite_version}\n"
    )
    console.flush()

signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
while True:
    try:
        os.wait()
    except ChildProcessError:
        signal.pause()
