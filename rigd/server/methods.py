"""The RPC method table (API.md)."""

from __future__ import annotations

import functools
import time
from datetime import UTC, datetime
from typing import Any

import trio

from netgate.broker import SecretStore
from netgate.errors import NetgateError
from rigd import __version__
from rigd.auth import Signer
from rigd.errors import Conflict, FieldError, NotFound, from_netgate
from rigd.images.importer import check_source, normalise_sha256
from rigd.images.registry import parse_reference
from rigd.model import BUILT_ENGINES, BUILT_SURFACES
from rigd.rigs.api import RigApi
from rigd.rigs.manager import Caller, RigManager
from rigd.rigs.params import RigRef, ident, integer, no_extra, obj, string
from rigd.rigs.pools import MAX_AGE_RANGE_S, check_fits, parse_pool_sizes, sizes_json
from rigd.server.imports import ImportJobs, listing
from rigd.server.pulls import PullJobs
from rigd.server.rpc import Method
from rigd.store.aio import Stores
from rigd.store.server_db import CLIPBOARD_CHOICES
from rigd.store.util import iso
from rigd.tools.catalogue import Tools

#: How long ``clipboard.grant`` allows a person's crossings on one rig.
CLIPBOARD_GRANT_S = 600
#: The longest ``source`` ``image.import`` takes (a path or a URL).
IMPORT_SOURCE_MAX = 4096


#: The surfaces with a screen a person can watch and drive.
LIVE_SURFACES = frozenset({"computer", "browser"})


def build_methods(
    stores: Stores, rigs: RigManager, signer: Signer | None, base_url: list[str],
    broker: SecretStore | None = None,
    *, images: ImportJobs | None = None, pulls: PullJobs | None = None,
) -> dict[str, Method]:
    server = stores.server
    api = RigApi(rigs)
    tools = Tools(api)
    # New rigs boot a workspace's custom image (rigs.smolvm.execImage) from the same settings.
    rigs.settings_of = tools.guard.settings

    async def workspace_list(caller: Caller, raw: object) -> list[dict[str, Any]]:
        no_extra(obj(raw), set())
        return [w.to_json() for w in await stores.run(server.workspaces_of, caller.user.id)]

    async def workspace_create(caller: Caller, raw: object) -> dict[str, Any]:
        params = obj(raw)
        no_extra(params, {"name"})
        name = string(params, "name", max_len=64)
        ws = await stores.run(server.create_workspace, name)
        await stores.run(server.add_member, ws.id, caller.user.id)
        return ws.to_json()

    async def user_create(caller: Caller, raw: object) -> dict[str, Any]:
        params = obj(raw)
        no_extra(params, {"name", "kind"})
        name = string(params, "name", max_len=64)
        kind = params.get("kind", "agent")
        user = await stores.run(server.create_user, name, kind if isinstance(kind, str) else "?")
        return user.to_json()

    async def _member_args(raw: object) -> tuple[str, str]:
        params = obj(raw)
        no_extra(params, {"workspace", "user"})
        ws_ref = string(params, "workspace", max_len=128)
        user_ref = string(params, "user", max_len=128)
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
        ws = await stores.run(server.get_workspace, ref)
        closed = await rigs.close_workspace(ws.id)
        await stores.run(server.delete_workspace, ws.id)
        return {"workspace": ws.id, "closedRigs": closed}

    async def events_subscribe(caller: Caller, raw: object) -> dict[str, Any]:
        params = obj(raw)
        no_extra(params, {"workspace"})
        ref = string(params, "workspace", max_len=128)
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
            "engines": sorted(e.value for e in BUILT_ENGINES),
            "memoryBudgetMb": rigs.memory_budget_mb,
            "memoryInUseMb": rigs.memory_in_use_mb(),
            "network": rigs.network or "none",
            "devHttpPort": rigs.ports.dev_http_port if rigs.ports else None,
            "devHttpsPort": rigs.ports.dev_https_port if rigs.ports else None,
            "devHttpsProblem": rigs.ports.tls_problem if rigs.ports else None,
            "devCaFingerprint": rigs.ports.ca_fingerprint if rigs.ports else None,
            "pools": rigs.pools.describe(),
            "poolMaxAgeS": int(rigs.pools.max_age_s),
        }

    async def _secret_workspace(caller: Caller, params: dict[str, Any]) -> tuple[str, SecretStore]:
        if broker is None:
            raise FieldError("method", "this server has no credential broker (rigs have no network)")
        ref = string(params, "workspace", max_len=128)
        ws = await stores.run(server.resolve_workspace, caller.user.id, ref)
        return ws.id, broker

    async def secret_set(caller: Caller, raw: object) -> dict[str, Any]:
        """Store a secret for the gateway to inject; its value is never returned or logged."""
        params = obj(raw)
        no_extra(params, {"workspace", "name", "value", "hosts", "header", "template"})
        ws_id, store = await _secret_workspace(caller, params)
        name = ident(params, "name")
        value = params.get("value")
        if not isinstance(value, str) or not value or len(value) > 16384:
            raise FieldError("value", "must be a non-empty string of at most 16384 characters")
        hosts = params.get("hosts")
        if not isinstance(hosts, list) or not hosts or not all(isinstance(h, str) for h in hosts):
            raise FieldError("hosts", "must be a non-empty list of host patterns")
        header = string(params, "header", required=False, max_len=64) or "Authorization"
        template = string(params, "template", required=False, max_len=256) or "Bearer {value}"
        try:
            entry = await trio.to_thread.run_sync(
                lambda: store.put(ws_id, name, value, hosts, header=header, template=template))
        except NetgateError as exc:
            raise from_netgate(exc) from None
        return {"workspace": ws_id, "name": name, "hosts": list(entry.hosts), "header": header}

    async def secret_list(caller: Caller, raw: object) -> list[dict[str, Any]]:
        params = obj(raw)
        no_extra(params, {"workspace"})
        ws_id, store = await _secret_workspace(caller, params)
        entries = await trio.to_thread.run_sync(store.list, ws_id)
        return [{"name": e.name, "hosts": list(e.hosts), "header": e.header} for e in entries]

    async def secret_delete(caller: Caller, raw: object) -> dict[str, Any]:
        params = obj(raw)
        no_extra(params, {"workspace", "name"})
        ws_id, store = await _secret_workspace(caller, params)
        name = ident(params, "name")
        await trio.to_thread.run_sync(store.delete, ws_id, name)
        return {"workspace": ws_id, "name": name, "deleted": True}

    async def server_configure(caller: Caller, raw: object) -> dict[str, Any]:
        """The memory budget and the pools (issue 28). Everything is checked before anything
        changes: pools that cannot fit the (new) budget are refused naming ``pools``, or
        ``memoryBudgetMb`` when it is the budget that shrank under them."""
        params = obj(raw)
        no_extra(params, {"memoryBudgetMb", "pools", "poolMaxAgeS"})
        budget = rigs.memory_budget_mb
        if "memoryBudgetMb" in params:
            budget = integer(params, "memoryBudgetMb", 256, 1 << 24, budget, "MB")
        sizes = dict(rigs.pools.sizes)
        if "pools" in params:
            sizes.update(parse_pool_sizes(params["pools"]))
        max_age = None
        if "poolMaxAgeS" in params:
            low, high = MAX_AGE_RANGE_S
            max_age = float(integer(params, "poolMaxAgeS", low, high, int(rigs.pools.max_age_s), "seconds"))
        check_fits(sizes, budget, "pools" if "pools" in params else "memoryBudgetMb")
        rigs.memory_budget_mb = budget
        rigs.pools.configure(sizes, max_age)
        return {"memoryBudgetMb": rigs.memory_budget_mb, "pools": sizes_json(rigs.pools.sizes),
                "poolMaxAgeS": int(rigs.pools.max_age_s)}

    async def signed_url(caller: Caller, raw: object, kind: str, route: str,
                         surfaces: frozenset[str] | None = None) -> dict[str, Any]:
        params = obj(raw)
        no_extra(params, {"rigId"})
        rig_id = ident(params, "rigId")
        rig = await api.get(caller, RigRef(rig_id))
        if surfaces is not None and rig["surface"] not in surfaces:
            raise FieldError("rigId", f"a {rig['surface']} rig has no {route} lane")
        if signer is None:
            raise FieldError("method", "this server signs no lane URLs")
        q = signer.sign(kind, rig["workspace"], rig_id, caller.user.id)
        path = f"/rig/{route}/{rig_id}?u={q['u']}&exp={q['exp']}&sig={q['sig']}"
        ws_base = base_url[0].replace("http://", "ws://").replace("https://", "wss://") if base_url else ""
        return {"path": path, "url": ws_base + path, "expires": int(q["exp"])}

    async def terminal_url(caller: Caller, raw: object) -> dict[str, Any]:
        """A signed ``rig-term`` URL of the PTY lane (/rig/term/<rigId>)."""
        return await signed_url(caller, raw, "rig-term", "term")

    async def view_url(caller: Caller, raw: object) -> dict[str, Any]:
        """A signed ``rig-view`` URL of a computer or browser rig's live view (/rig/live/<rigId>)."""
        return await signed_url(caller, raw, "rig-view", "live", surfaces=LIVE_SURFACES)

    async def files_url(caller: Caller, raw: object) -> dict[str, Any]:
        """Signed ``rig-files`` paths of a rig's file and clipboard lanes."""
        params = obj(raw)
        no_extra(params, {"rigId"})
        rig_id = ident(params, "rigId")
        rig = await api.get(caller, RigRef(rig_id))
        if signer is None:
            raise FieldError("method", "this server signs no lane URLs")
        q = signer.sign("rig-files", rig["workspace"], rig_id, caller.user.id)
        query = f"u={q['u']}&exp={q['exp']}&sig={q['sig']}"
        base = base_url[0] if base_url else ""
        expires = int(q["exp"])
        return {"path": f"/rig/files/{rig_id}?{query}", "clipboardPath": f"/rig/clipboard/{rig_id}?{query}",
                "url": f"{base}/rig/files/{rig_id}?{query}", "expires": expires,
                "expiresAt": iso(datetime.fromtimestamp(expires, UTC))}

    def _person(caller: Caller) -> None:
        if caller.user.kind != "person":
            raise FieldError("method", "clipboard access is a person's own choice; agent tokens have none")

    async def clipboard_policy_get(caller: Caller, raw: object) -> dict[str, Any]:
        no_extra(obj(raw), set())
        _person(caller)
        policy = await stores.run(server.clipboard_policy, caller.user.id, time.time())
        return policy.to_json()

    async def clipboard_policy_set(caller: Caller, raw: object) -> dict[str, Any]:
        params = obj(raw)
        no_extra(params, {"hostToRig", "rigToHost"})
        _person(caller)
        choices: dict[str, str | None] = {}
        for name in ("hostToRig", "rigToHost"):
            value = params.get(name)
            if value is not None and value not in CLIPBOARD_CHOICES:
                raise FieldError(name, "must be allow, ask or deny")
            choices[name] = value
        if not any(choices.values()):
            raise FieldError("hostToRig", "give hostToRig, rigToHost or both")
        policy = await stores.run(server.set_clipboard_policy, caller.user.id, choices["hostToRig"],
                                  choices["rigToHost"], time.time())
        return policy.to_json()

    async def clipboard_grant(caller: Caller, raw: object) -> dict[str, Any]:
        """Allow the caller's clipboard crossings on one rig for ten minutes."""
        params = obj(raw)
        no_extra(params, {"rigId"})
        _person(caller)
        rig_id = ident(params, "rigId")
        await api.get(caller, RigRef(rig_id))
        until = time.time() + CLIPBOARD_GRANT_S
        await stores.run(server.grant_clipboard, caller.user.id, rig_id, until)
        return {"rigId": rig_id, "until": iso(datetime.fromtimestamp(until, UTC))}

    async def clipboard_policy_list(caller: Caller, raw: object) -> list[dict[str, Any]]:
        """Every person's clipboard choices (admins): defaults for those who never chose."""
        no_extra(obj(raw), set())
        rows = await stores.run(server.clipboard_policies, time.time())
        return [{"user": {"id": user.id, "name": user.name}, **policy.to_json(), "updatedAt": updated}
                for user, policy, updated in rows]

    def _imports() -> ImportJobs:
        if images is None:
            raise FieldError("method", "this server runs no image imports")
        return images

    async def image_import(caller: Caller, raw: object) -> dict[str, Any]:
        """Start importing a desktop image in the background; answers at once with the job."""
        params = obj(raw)
        no_extra(params, {"source", "sha256"})
        jobs = _imports()
        source = string(params, "source", max_len=IMPORT_SOURCE_MAX)
        if source != source.strip() or not source.isprintable():
            raise FieldError("source", "must be a path or URL without surrounding spaces or control "
                                       "characters")
        sha = normalise_sha256(string(params, "sha256", max_len=80))
        await trio.to_thread.run_sync(check_source, source)
        return jobs.start(source, sha).to_json()

    def _import_id(raw: object) -> str:
        params = obj(raw)
        no_extra(params, {"importId"})
        return ident(params, "importId")

    async def image_import_status(caller: Caller, raw: object) -> dict[str, Any]:
        return _imports().get(_import_id(raw)).to_json()

    async def image_import_cancel(caller: Caller, raw: object) -> dict[str, Any]:
        job = await _imports().cancel(_import_id(raw))
        return job.to_json()

    async def image_list(caller: Caller, raw: object) -> list[dict[str, Any]]:
        """Every imported desktop image (``boots`` marks the one computer rigs boot); with
        ``source: "registry"``, the images pulled from registries."""
        params = obj(raw)
        no_extra(params, {"source"})
        source = params.get("source", "import")
        if source == "registry":
            return await trio.to_thread.run_sync(_pulls().store.images)
        if source != "import":
            raise FieldError("source", "must be import (desktop images imported) or registry (images pulled)")
        return listing(await trio.to_thread.run_sync(_imports().listing))

    def _pulls() -> PullJobs:
        if pulls is None:
            raise FieldError("method", "this server pulls no images")
        return pulls

    async def image_pull(caller: Caller, raw: object) -> dict[str, Any]:
        """Start pulling a registry image in the background; answers at once with the job."""
        params = obj(raw)
        no_extra(params, {"ref", "workspace"})
        ref = parse_reference(params.get("ref"), "ref")
        pulls = _pulls()
        announce = None
        if pulls.events is not None:
            # Progress goes to a workspace's events: the one named, else the caller's default.
            wanted = string(params, "workspace", max_len=128) if "workspace" in params else "default"
            announce = await rigs.workspace_for(caller, wanted)
        return pulls.start(ref, announce=announce).to_json()

    def _pull_id(raw: object) -> str:
        params = obj(raw)
        no_extra(params, {"pullId"})
        return ident(params, "pullId")

    async def image_pull_status(caller: Caller, raw: object) -> dict[str, Any]:
        return _pulls().get(_pull_id(raw)).to_json()

    async def image_pull_cancel(caller: Caller, raw: object) -> dict[str, Any]:
        return (await _pulls().cancel(_pull_id(raw))).to_json()

    async def image_rm(caller: Caller, raw: object) -> dict[str, Any]:
        """Forget a pulled image and delete the blobs no other pulled image shares; refused
        while a rig booted from it is open."""
        params = obj(raw)
        no_extra(params, {"ref"})
        ref = string(params, "ref", max_len=600)
        store = _pulls().store
        image = await trio.to_thread.run_sync(store.find, ref)
        if image is None:
            raise NotFound(f"no pulled image {ref!r} (image.list {{source: registry}} lists them)",
                           field="ref")
        users = sorted(r.row.id for r in rigs.live.values() if r.row.image == image["digest"])
        if users:
            raise Conflict(f"{image['reference']} is in use by {', '.join(users)}; close them first",
                           field="ref", rigs=users)
        removed = await trio.to_thread.run_sync(store.remove, str(image["reference"]))
        return {"reference": image["reference"], "digest": image["digest"], "removedBlobs": removed}

    def rig_method(name: str) -> Method:
        """A rig method: its parameters parsed into typed values here, at the edge."""
        return Method(functools.partial(api.call, name))

    return {
        "rig.open": rig_method("rig.open"),
        "rig.viewUrl": Method(view_url),
        "rig.list": rig_method("rig.list"),
        "rig.get": rig_method("rig.get"),
        "rig.close": rig_method("rig.close"),
        "rig.act": rig_method("rig.act"),
        "rig.log": rig_method("rig.log"),
        "rig.terminalUrl": Method(terminal_url),
        "rig.filesUrl": Method(files_url),
        "clipboard.policy.get": Method(clipboard_policy_get),
        "clipboard.policy.set": Method(clipboard_policy_set),
        "clipboard.grant": Method(clipboard_grant),
        "clipboard.policy.list": Method(clipboard_policy_list, admin=True),
        "image.import": Method(image_import, admin=True),
        "image.importStatus": Method(image_import_status, admin=True),
        "image.importCancel": Method(image_import_cancel, admin=True),
        "image.list": Method(image_list),
        "image.pull": Method(image_pull, admin=True),
        "image.pullStatus": Method(image_pull_status, admin=True),
        "image.pullCancel": Method(image_pull_cancel, admin=True),
        "image.rm": Method(image_rm, admin=True),
        "rig.control": rig_method("rig.control"),
        "rig.egress": rig_method("rig.egress"),
        "secret.set": Method(secret_set),
        "secret.list": Method(secret_list),
        "secret.delete": Method(secret_delete),
        "rig.watch": rig_method("rig.watch"),
        "rig.park": rig_method("rig.park"),
        "rig.fork": rig_method("rig.fork"),
        "snapshot.create": rig_method("snapshot.create"),
        "snapshot.list": rig_method("snapshot.list"),
        "snapshot.rm": rig_method("snapshot.rm"),
        "volume.create": rig_method("volume.create"),
        "volume.list": rig_method("volume.list"),
        "volume.rm": rig_method("volume.rm"),
        "seat.list": rig_method("seat.list"),
        "seat.acquire": rig_method("seat.acquire"),
        "seat.release": rig_method("seat.release"),
        "seat.handOver": rig_method("seat.handOver"),
        "seat.handBack": rig_method("seat.handBack"),
        "seat.rm": rig_method("seat.rm"),
        "login.save": rig_method("login.save"),
        "login.list": rig_method("login.list"),
        "login.rm": rig_method("login.rm"),
        "rig.retry": rig_method("rig.retry"),
        "rig.events": rig_method("rig.events"),
        "rig.ports": rig_method("rig.ports"),
        "rig.port.share": rig_method("rig.port.share"),
        "rig.domain.set": rig_method("rig.domain.set"),
        "rig.domain.unset": rig_method("rig.domain.unset"),
        "events.subscribe": Method(events_subscribe),
        "conversation.end": rig_method("conversation.end"),
        "workspace.delete": Method(workspace_delete, admin=True),
        "tools.list": Method(tools.list),
        "tools.call": Method(tools.call),
        "workspace.settings.get": Method(tools.guard.get_settings),
        "workspace.settings.set": Method(tools.guard.set_setting, admin=True),
        "approval.list": Method(tools.guard.list_approvals),
        "approval.decide": Method(tools.guard.decide),
        "guard.log": Method(tools.guard.guard_log),
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
