"""The RPC method table (API.md)."""

from __future__ import annotations

from typing import Any

from rigd import __version__
from rigd.errors import FieldError, NotFound
from rigd.model import BUILT_SURFACES
from rigd.params import ident, integer, no_extra, obj, string
from rigd.rigs import Caller, RigManager
from rigd.server.rpc import Method
from rigd.store.aio import Stores
from rigd.tools import Tools


def build_methods(stores: Stores, rigs: RigManager, signer: Any, base_url: list[str]) -> dict[str, Method]:
    server = stores.server
    tools = Tools(rigs)

    async def workspace_list(caller: Caller, raw: object) -> list[dict[str, Any]]:
        no_extra(obj(raw), set())
        return [w.to_json() for w in await stores.run(server.workspaces_of, caller.user.id)]

    async def workspace_create(caller: Caller, raw: object) -> dict[str, Any]:
        params = obj(raw)
        no_extra(params, {"name"})
        name = string(params, "name", max_len=64)
        assert name is not None
        ws = await stores.run(server.create_workspace, name)
        await stores.run(server.add_member, ws.id, caller.user.id)
        return ws.to_json()

    async def user_create(caller: Caller, raw: object) -> dict[str, Any]:
        params = obj(raw)
        no_extra(params, {"name", "kind"})
        name = string(params, "name", max_len=64)
        kind = params.get("kind", "agent")
        assert name is not None
        user = await stores.run(server.create_user, name, kind if isinstance(kind, str) else "?")
        return user.to_json()

    async def _member_args(raw: object) -> tuple[str, str]:
        params = obj(raw)
        no_extra(params, {"workspace", "user"})
        ws_ref = string(params, "workspace", max_len=128)
        user_ref = string(params, "user", max_len=128)
        assert ws_ref is not None and user_ref is not None
        ws = await stores.run(server.get_workspace, ws_ref)
        user = await stores.run(server.find_user, user_ref)
        if user is None:
            try:
                user = await stores.run(server.get_user, user_ref)
            except NotFound as exc:
                raise FieldError("user", "no such user (give a user id or name)") from exc
        return ws.id, user.id

    async def member_add(caller: Caller, raw: object) -> dict[str, Any]:
        ws_id, user_id = await _member_args(raw)
        await stores.run(server.add_member, ws_id, user_id)
        return {"workspace": ws_id, "user": user_id}

    async def member_remove(caller: Caller, raw: object) -> dict[str, Any]:
        ws_id, user_id = await _member_args(raw)
        remaining = await stores.run(server.remove_member, ws_id, user_id)
        closed = await rigs.close_workspace(ws_id) if remaining == 0 else []
        return {"workspace": ws_id, "user": user_id, "remainingMembers": remaining,
                "closedRigs": closed}

    async def workspace_delete(caller: Caller, raw: object) -> dict[str, Any]:
        params = obj(raw)
        no_extra(params, {"workspace"})
        ref = string(params, "workspace", max_len=128)
        assert ref is not None
        ws = await stores.run(server.get_workspace, ref)
        closed = await rigs.close_workspace(ws.id)
        await stores.run(server.delete_workspace, ws.id)
        return {"workspace": ws.id, "closedRigs": closed}

    async def events_subscribe(caller: Caller, raw: object) -> dict[str, Any]:
        params = obj(raw)
        no_extra(params, {"workspace"})
        ref = string(params, "workspace", max_len=128)
        assert ref is not None
        if caller.session is None:
            raise FieldError("method", "events.subscribe needs the WebSocket transport (GET /rpc)")
        ws = await stores.run(server.resolve_workspace, caller.user.id, ref)
        caller.session.subscribe(ws.id, rigs.events.subscribe(ws.id))
        return {"workspace": ws.id, "subscribed": True}

    async def token_create(caller: Caller, raw: object) -> dict[str, Any]:
        params = obj(raw)
        no_extra(params, {"user", "label"})
        user_ref = string(params, "user", max_len=128)
        label = string(params, "label", required=False, max_len=64) or "token"
        assert user_ref is not None
        user = await stores.run(server.find_user, user_ref)
        if user is None:
            try:
                user = await stores.run(server.get_user, user_ref)
            except NotFound as exc:
                raise FieldError("user", "no such user (give a user id or name)") from exc
        token = await stores.run(server.create_token, user.id, label)
        return {"user": user.to_json(), "token": token}

    async def whoami(caller: Caller, raw: object) -> dict[str, Any]:
        no_extra(obj(raw), set())
        return caller.user.to_json()

    async def server_info(caller: Caller, raw: object) -> dict[str, Any]:
        no_extra(obj(raw), set())
        return {
            "version": __version__,
            "accel": rigs.accel.value if rigs.accel else None,
            "accelProblem": rigs.accel_problem,
            "surfaces": sorted(s.value for s in BUILT_SURFACES),
            "memoryBudgetMb": rigs.memory_budget_mb,
        }

    async def server_configure(caller: Caller, raw: object) -> dict[str, Any]:
        params = obj(raw)
        no_extra(params, {"memoryBudgetMb"})
        if "memoryBudgetMb" in params:
            rigs.memory_budget_mb = integer(params, "memoryBudgetMb", 256, 1 << 24, 0, "MB")
        return {"memoryBudgetMb": rigs.memory_budget_mb}

    async def terminal_url(caller: Caller, raw: object) -> dict[str, Any]:
        params = obj(raw)
        no_extra(params, {"rigId"})
        rig_id = ident(params, "rigId")
        assert rig_id is not None
        rig = await rigs.get(caller, {"rigId": rig_id})
        q = signer.sign("rig-term", rig["workspace"], rig_id, caller.user.id)
        path = f"/rig/term/{rig_id}?u={q['u']}&exp={q['exp']}&sig={q['sig']}"
        ws_base = base_url[0].replace("http://", "ws://").replace("https://", "wss://") if base_url else ""
        return {"path": path, "url": ws_base + path, "expires": int(q["exp"])}

    return {
        "rig.open": Method(rigs.open),
        "rig.list": Method(rigs.list_rigs),
        "rig.get": Method(rigs.get),
        "rig.close": Method(rigs.close),
        "rig.act": Method(rigs.act),
        "rig.log": Method(rigs.actions),
        "rig.terminalUrl": Method(terminal_url),
        "rig.control": Method(rigs.control),
        "rig.watch": Method(rigs.watch),
        "rig.park": Method(rigs.park),
        "rig.retry": Method(rigs.retry),
        "rig.events": Method(rigs.events_since),
        "events.subscribe": Method(events_subscribe),
        "conversation.end": Method(rigs.end_conversation),
        "workspace.delete": Method(workspace_delete, admin=True),
        "tools.list": Method(tools.list),
        "tools.call": Method(tools.call),
        "workspace.list": Method(workspace_list),
        "workspace.create": Method(workspace_create, admin=True),
        "user.create": Method(user_create, admin=True),
        "member.add": Method(member_add, admin=True),
        "member.remove": Method(member_remove, admin=True),
        "token.create": Method(token_create, admin=True),
        "whoami": Method(whoami),
        "server.info": Method(server_info),
        "server.configure": Method(server_configure, admin=True),
    }
