"""The server's ports: every running terminal rig's :class:`RigPorts`, the dev
domains, and the dev HTTP/HTTPS listeners (RIGS.md §8, docs/ports.md)."""

from __future__ import annotations

import logging
import ssl
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import trio

from rigd.errors import Conflict, FieldError
from rigd.ports.devhttp import DevDomains, DevServer
from rigd.ports.forwards import RigPorts

log = logging.getLogger("rigd.ports")


class PortsHub:
    def __init__(self, *, tls: ssl.SSLContext | None, tls_problem: str | None = None,
                 lan_allowed: bool = False, lan_host: str = "", ca_pem: str | None = None,
                 ca_fingerprint: str | None = None) -> None:
        #: The dev CA's certificate (public: served at ``GET /ca.pem``) and its SHA-256.
        self.ca_pem = ca_pem
        self.ca_fingerprint = ca_fingerprint
        self.domains = DevDomains()
        self.rigs: dict[str, RigPorts] = {}
        self.tls = tls
        self.tls_problem = tls_problem
        self.lan_allowed = lan_allowed
        self.lan_host = lan_host
        self.dev = DevServer(self.domains, self.rigs.get, tls)

    @property
    def dev_http_port(self) -> int | None:
        return self.dev.http_port

    @property
    def dev_https_port(self) -> int | None:
        return self.dev.https_port

    async def run(self, http_port: int | None, https_port: int | None, *,
                  task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """The dev listeners (none when ``http_port`` is None), until cancelled."""
        if http_port is None:
            task_status.started()
            await trio.sleep_forever()
        await self.dev.run(http_port, https_port, task_status=task_status)

    async def serve_rig(self, rig_id: str, socket_path: Path,
                        run_in_guest: Callable[[tuple[str, ...]], Awaitable[None]], *,
                        awake: Callable[[], bool], on_connect: Callable[[], Awaitable[None]]) -> None:
        """Forward a rig's ports for as long as this runs (the rig's machine lives)."""
        ports = RigPorts(rig_id, socket_path, run_in_guest, awake=awake, on_connect=on_connect,
                         lan_allowed=self.lan_allowed, lan_host=self.lan_host,
                         domains_of=self.domains.ports_of)
        self.rigs[rig_id] = ports
        try:
            await ports.run()
        finally:
            # A closed rig's forwards and names are gone at once.
            if self.rigs.get(rig_id) is ports:
                del self.rigs[rig_id]
            self.domains.drop_rig(rig_id)

    def describe(self, rig_id: str) -> dict[str, Any] | None:
        ports = self.rigs.get(rig_id)
        if ports is None:
            return None
        out = ports.describe()
        out["domains"] = [self.domain_json(name, port)
                          for name, port in self.domains.of_rig(rig_id).items()]
        return out

    def domain_json(self, name: str, guest_port: int) -> dict[str, Any]:
        http, https = self.dev_http_port, self.dev_https_port
        return {
            "name": name, "guestPort": guest_port,
            "url": f"http://{name}:{http}/" if http else None,
            "httpsUrl": f"https://{name}:{https}/" if https else None,
        }

    def running(self, rig_id: str) -> RigPorts:
        ports = self.rigs.get(rig_id)
        if ports is None:
            raise Conflict(f"rig {rig_id} forwards no ports (only running terminal rigs do)")
        return ports

    async def set_domain(self, rig_id: str, name: str, guest_port: int) -> dict[str, Any]:
        ports = self.running(rig_id)
        if self.dev_http_port is None:
            raise Conflict("dev domains are off on this server (no dev HTTP port)")
        if guest_port not in ports.state.listening.ports:
            await ports.refresh()
        if guest_port not in ports.state.listening.ports:
            raise FieldError("guestPort", f"the guest does not listen on port {guest_port}"
                             + (f" ({ports.state.problem})" if ports.state.problem else ""))
        self.domains.set(rig_id, name, guest_port)
        log.info("rig %s: dev domain %s -> guest port %d", rig_id, name, guest_port)
        return self.domain_json(name, guest_port)


__all__ = ["PortsHub"]
