"""netgate: a rig's egress gateway (topology, nftables, DNS, SNI/Host proxy, credential broker).

Entry point: :func:`netgate.gateway.open_gateway`. Design and wiring: ``docs/netgate.md``.
Pure modules (no I/O): ``policy``, ``dns``, ``sniff``, ``nft``. Trio: ``proxy``,
``resolver``, ``gateway``. Synchronous netlink (call via ``trio.to_thread``): ``topology``.
Tests and benchmarks only: ``testing``, ``fakenet``.
"""
