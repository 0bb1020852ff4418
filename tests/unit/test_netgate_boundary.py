"""netgate raises its own errors (it imports nothing from rigd); rigd maps them where it
calls netgate, so a caller still gets a field error naming the field, never a 500."""

from __future__ import annotations

from pathlib import Path

import pytest

from netgate.broker import SecretStore
from netgate.errors import InvalidField, NetgateError, Refused
from rigd.backends.fake import FakeBackend
from rigd.errors import FieldError, Forbidden, RigdError, from_netgate
from rigd.model import Accel, Surface
from rigd.rigs.manager import Caller, RigManager
from rigd.server.methods import build_methods
from rigd.server.rpc import Dispatcher
from rigd.store.aio import Stores


def test_each_netgate_error_maps_to_its_rigd_error() -> None:
    field = from_netgate(InvalidField("egress.allow[2]", "is an IP address"))
    assert isinstance(field, FieldError)
    assert (field.field, field.reason) == ("egress.allow[2]", "is an IP address")
    assert field.to_json()["data"] == {"field": "egress.allow[2]", "reason": "is an IP address"}
    refused = from_netgate(Refused("no secret is issued for x.test"))
    assert isinstance(refused, Forbidden) and refused.message == "no secret is issued for x.test"
    other = from_netgate(NetgateError("the gateway broke"))
    assert type(other) is RigdError and other.message == "the gateway broke"


def test_an_open_with_a_bad_allowlist_entry_names_the_entry(tmp_path: Path) -> None:
    stores = Stores(tmp_path)
    try:
        rigs = RigManager(stores, {Surface.TERMINAL: FakeBackend()}, accel=Accel.TCG, network="gateway")
        with pytest.raises(FieldError) as info:
            rigs.egress_policy(Surface.TERMINAL, ["pages.example", "10.0.0.1"], defaults=False)
        assert info.value.field == "egress.allow[1]" and "IP address" in info.value.reason
        assert rigs.egress_policy(Surface.TERMINAL, ["pages.example"], defaults=False) is not None
    finally:
        stores.close()


async def test_secret_set_with_a_bad_header_is_a_field_error(tmp_path: Path) -> None:
    stores = Stores(tmp_path / "db")
    broker = SecretStore(tmp_path / "broker")
    try:
        admin, _ws, _ = stores.server.bootstrap()
        rigs = RigManager(stores, {Surface.TERMINAL: FakeBackend()}, accel=Accel.TCG)
        dispatcher = Dispatcher(build_methods(stores, rigs, None, [], broker))
        for params, field in (({"header": "Bad Header"}, "header"), ({"hosts": ["10.0.0.1"]}, "hosts[0]")):
            request = {"workspace": "default", "name": "api", "value": "s3cret", "hosts": ["api.example"],
                       **params}
            reply = await dispatcher.handle(Caller(admin), {"jsonrpc": "2.0", "id": 1, "method": "secret.set",
                                                            "params": request})
            assert reply is not None and "error" in reply, reply
            assert reply["error"]["code"] == FieldError.code
            assert reply["error"]["data"]["field"] == field
            assert "s3cret" not in str(reply)
    finally:
        broker.close()
        stores.close()
