"""A rig's egress gate, handed to its machine: the netgate gateway namespace
(root), or QEMU user networking relayed to the same proxy and DNS.

:func:`open_gate` holds the gate for the machine's whole life;
:func:`net_argv` is the NIC part of any recipe's QEMU command line.
"""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import trio

from netgate.broker import SecretStore
from netgate.gateway import Gateway, GatewayError, open_gateway
from netgate.policy import build_policy
from netgate.proxy import AuditEvent
from netgate.topology import ADDRESSING
from netgate.usermode import SANDBOX as USER_SANDBOX
from netgate.usermode import SOCKET_NAME, UserGate, guest_net_arg, helper_python, open_user_gate
from netgate.usermode import netdev as user_netdev
from rigd.backends.base import NetSpec
from rigd.backends.snapshot import rig_mac
from rigd.errors import BackendError

#: A rig's egress gate: a gateway namespace (root) or QEMU user networking relayed to the same proxy.
NetGate = Gateway | UserGate


@dataclass(frozen=True, slots=True)
class NetworkConfig:
    """How rigs reach the network: through netgate, one gate per rig.

    ``mode`` ``"gateway"``: a gateway namespace per rig, the tap handed to
    QEMU by fd (needs root). ``"user"``: QEMU's user networking with
    ``restrict=on`` relayed to the same proxy and DNS (no privileges needed;
    QEMU's sandbox then allows spawn, see :mod:`netgate.usermode`).
    """

    #: Upstream DNS server for the gateway's own lookups (None: /etc/resolv.conf).
    resolver: tuple[str, int] | None = None
    #: Dial out of this namespace instead of the server's (tests: the fake internet).
    upstream_netns: str | None = None
    #: The credential broker (secrets injected for bound hosts).
    broker: SecretStore | None = None
    prefix: str = "rigd"
    #: CA bundle for verifying brokered hosts (None: the system's CAs).
    upstream_ca: Path | None = None
    mode: str = "gateway"
    #: The interpreter of user mode's relay helper (None: :func:`netgate.usermode.helper_python`).
    helper_python: str | None = None

    def __post_init__(self) -> None:
        if self.mode not in ("gateway", "user"):
            raise ValueError(f"network mode {self.mode!r} is not 'gateway' or 'user'")


def net_argv(cfg: NetworkConfig | None, rig_dir: Path, tap_fd: int | str | None) -> dict[str, Any]:
    """The NIC part of a rig's QEMU command line (``{}`` without a network):
    ``netdev`` (id ``net0``), ``nic_netdev``, the guest's ``rigd.net=``
    (``cmdline_extra``) and, in user mode, the sandbox that allows spawn."""
    if cfg is not None and cfg.mode == "user":
        return {
            "netdev": user_netdev(rig_dir / SOCKET_NAME, python=cfg.helper_python or helper_python()),
            "nic_netdev": "net0",
            "cmdline_extra": [guest_net_arg()],
            "sandbox_opts": USER_SANDBOX,
        }
    if cfg is not None:
        a = ADDRESSING
        return {
            "netdev": f"tap,id=net0,fd={tap_fd},vhost=off",
            "nic_netdev": "net0",
            "cmdline_extra": [f"rigd.net={a.guest}/{a.prefixlen},{a.gateway},{a.dns}"],
        }
    return {}


def _drop_audit(_event: AuditEvent) -> None:
    pass


@asynccontextmanager
async def open_gate(
    cfg: NetworkConfig | None, rig_id: str, net: NetSpec | None, progress: Callable[[str], None]
) -> AsyncIterator[NetGate | None]:
    """The rig's egress gate for the machine's whole life (None: no network).

    A machine without a :class:`NetSpec` (a snapshot build) still gets a gate
    when the server gives rigs a network — closed to everything — so its
    argv has the same shape as the rigs that restore it.
    """
    if cfg is None:
        yield None
        return
    progress("opening the egress gateway")
    policy = net.policy if net is not None else build_policy("computer", defaults=False)
    broker = None
    if cfg.broker is not None and net is not None:
        has_secrets = await trio.to_thread.run_sync(cfg.broker.list, net.workspace)
        broker = cfg.broker if has_secrets else None
    upstream_ssl = (ssl.create_default_context(cafile=str(cfg.upstream_ca))
                    if cfg.upstream_ca is not None else None)
    audit = net.audit if net is not None else _drop_audit
    workspace = net.workspace if net is not None else None
    if cfg.mode == "user":
        async with open_user_gate(
            rig_id, policy, audit=audit, resolver_address=cfg.resolver,
            upstream_netns=cfg.upstream_netns, broker=broker, workspace=workspace,
            upstream_ssl=upstream_ssl,
        ) as gate:
            yield gate
        return
    try:
        async with open_gateway(
            rig_id, policy, audit=audit, resolver_address=cfg.resolver,
            upstream_netns=cfg.upstream_netns, broker=broker, workspace=workspace,
            prefix=cfg.prefix, guest_mac=rig_mac(rig_id), upstream_ssl=upstream_ssl,
        ) as gateway:
            yield gateway
    except GatewayError as exc:
        raise BackendError(f"the egress gateway failed: {exc}") from exc


__all__ = ["SOCKET_NAME", "USER_SANDBOX", "NetGate", "NetworkConfig", "net_argv", "open_gate"]
