"""netgate: a rig's egress gateway (topology, nftables, DNS, SNI/Host proxy, credential broker).

Entry point: :func:`netgate.gateway.open_gateway`. Design and wiring: ``docs/netgate.md``.
Pure modules (no I/O): ``policy``, ``dns``, ``sniff``, ``nft``. Trio: ``proxy``,
``resolver``, ``gateway``. Synchronous netlink (call via ``trio.to_thread``): ``topology``.
Tests and benchmarks only: ``testing``, ``fakenet``.

A library of its own: it imports nothing from rigd (tests/unit/test_layers.py). Its
errors are its own (``errors``: a refused field names it), mapped by the caller at its
boundary (:func:`rigd.errors.from_netgate`); ``cleanup`` is the best-effort directory
removal that rigd uses too.
"""
