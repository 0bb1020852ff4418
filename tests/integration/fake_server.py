"""A real rigd HTTP server (the app, hypercorn, the stores, the rig manager)
over the fake backend, for tests of the server's transports that need no VM:
``python -m tests.integration.fake_server DATA_DIR``.

Like ``rigd serve`` it writes ``server.json`` (its URL) and ``admin.token`` in
the data directory, and on SIGTERM closes every rig and exits.
"""

from __future__ import annotations

import functools
import json
import signal
import sys
from pathlib import Path

import trio
from hypercorn.trio import serve as hyper_serve

from rigd.auth import Signer, load_or_create_key
from rigd.backends.fake import FakeBackend
from rigd.model import Accel, Surface
from rigd.rigs.manager import RigManager
from rigd.server.app import ServerContext
from rigd.server.lanes import server_app
from rigd.server.main import http_config, write_private
from rigd.server.methods import build_methods
from rigd.server.rpc import Dispatcher
from rigd.store.aio import Stores


async def main(data_dir: Path) -> None:
    stores = Stores(data_dir)
    try:
        admin, _ws, _ = await stores.run(stores.server.bootstrap)
        token = await stores.run(stores.server.create_token, admin.id, "admin")
        write_private(data_dir / "admin.token", token + "\n")
        rigs = RigManager(stores, {Surface.TERMINAL: FakeBackend(), Surface.COMPUTER: FakeBackend()},
                          accel=Accel.TCG)
        signer = Signer(load_or_create_key(data_dir / "signing.key"))
        base_url: list[str] = []
        app = server_app(ServerContext(stores, rigs, Dispatcher(build_methods(stores, rigs, signer, base_url)),
                                       signer))
        async with trio.open_nursery() as nursery:
            await nursery.start(rigs.run)
            shutdown = trio.Event()

            async def on_signals() -> None:
                with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
                    async for _ in signals:
                        shutdown.set()
                        return

            nursery.start_soon(on_signals)
            binds = await nursery.start(functools.partial(
                hyper_serve, app, http_config("127.0.0.1", 0), shutdown_trigger=shutdown.wait))
            base_url.append(str(binds[0]))
            write_private(data_dir / "server.json", json.dumps({"url": str(binds[0])}) + "\n")
            await shutdown.wait()
            await rigs.shutdown()
            nursery.cancel_scope.cancel()
    finally:
        stores.close()


if __name__ == "__main__":
    trio.run(main, Path(sys.argv[1]))
