"""Saved site logins (issue 30): kept sealed, filled into matching HTTPS login forms by the
browser driver, never typed through the model.

- ``login.save {workspace, site, account, password}``: people only (an agent can neither
  read nor write a password). ``site`` is an ``https://`` origin (``https://host[:port]``;
  a path is refused, not dropped); ``account`` 1-256 printable characters; ``password``
  1-1024 bytes of UTF-8 without NUL. Saving the same site and account again replaces it.
- ``login.list {workspace}`` → ``[{site, account, createdBy, createdAt}]``: anyone of the
  workspace, agents included (they name the account to use), never a password.
- ``login.rm {workspace, site, account}``: people only.
- ``browser_use {action: "login", site, account}``: the rig's workspace's saved password
  is opened here, on the host, and handed to the driver in the parsed action (a field that
  no repr, audit row or answer carries); the driver fills it only when the page's origin
  is exactly ``site`` over HTTPS (:meth:`rigd.browser.driver.PageVerbs._do_login`).

Sealing: AES-256-GCM with a 32-byte key in ``<dataDir>/logins/key`` (0600; outside every
database, so a copy of a workspace's DB alone opens nothing), a fresh nonce per password,
and the workspace, site and account as associated data (a sealed row moved to another
account or workspace does not open).
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import trio
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from rigd.errors import FieldError, Forbidden, NotFound, RigdError
from rigd.rigs.params import no_extra, obj, string
from rigd.store.util import sealing_key
from rigd.verbs.browser import BrowserLogin, parse_account, parse_site

if TYPE_CHECKING:
    from rigd.rigs.manager import Caller, RigManager

MAGIC = b"rigd-login/1\0"
PASSWORD_MAX_BYTES = 1024


def parse_password(raw: object) -> str:
    if not isinstance(raw, str) or not raw:
        raise FieldError("password", "is required: a non-empty string")
    if "\0" in raw:
        raise FieldError("password", "must not contain NUL")
    if len(raw.encode("utf-8", "surrogatepass")) > PASSWORD_MAX_BYTES:
        raise FieldError("password", f"must be at most {PASSWORD_MAX_BYTES} bytes of UTF-8")
    return raw


@dataclass(frozen=True, slots=True)
class LoginSave:
    workspace: str
    site: str
    account: str
    password: str = field(repr=False)


@dataclass(frozen=True, slots=True)
class LoginRef:
    workspace: str
    site: str
    account: str


def parse_login_save(raw: object) -> LoginSave:
    params = obj(raw)
    no_extra(params, {"workspace", "site", "account", "password"})
    return LoginSave(string(params, "workspace", max_len=128), parse_site(params.get("site")),
                     parse_account(params.get("account")), parse_password(params.get("password")))


def parse_login_ref(raw: object) -> LoginRef:
    params = obj(raw)
    no_extra(params, {"workspace", "site", "account"})
    return LoginRef(string(params, "workspace", max_len=128), parse_site(params.get("site")),
                    parse_account(params.get("account")))


class LoginVault:
    """Seals and opens passwords with the server's login key. Blocking: call from a thread."""

    def __init__(self, data_dir: Path) -> None:
        self.key_path = data_dir / "logins" / "key"

    @staticmethod
    def _aad(workspace: str, site: str, account: str) -> bytes:
        return f"rigd-login/v1\0{workspace}\0{site}\0{account}".encode()

    def seal(self, workspace: str, site: str, account: str, password: str) -> bytes:
        nonce = secrets.token_bytes(12)
        aead = AESGCM(sealing_key(self.key_path))
        return MAGIC + nonce + aead.encrypt(nonce, password.encode(), self._aad(workspace, site, account))

    def open(self, workspace: str, site: str, account: str, sealed: bytes) -> str:
        if not sealed.startswith(MAGIC) or len(sealed) < len(MAGIC) + 12 + 16:
            raise RigdError(f"the saved login for {account} at {site} is not a sealed login")
        nonce, body = sealed[len(MAGIC):len(MAGIC) + 12], sealed[len(MAGIC) + 12:]
        try:
            aead = AESGCM(sealing_key(self.key_path))
            plain = aead.decrypt(nonce, body, self._aad(workspace, site, account))
        except InvalidTag:
            raise RigdError(f"the saved login for {account} at {site} does not open (tampered, moved, or "
                            "the server's login key changed); save it again") from None
        return plain.decode()


class Logins:
    """The ``login.*`` methods and the password lookup of ``browser_use login``."""

    def __init__(self, rigs: RigManager) -> None:
        self.rigs = rigs
        self.vault = LoginVault(rigs.stores.data_dir)

    @staticmethod
    def _person(caller: Caller, what: str) -> None:
        if caller.user.kind != "person":
            raise Forbidden(f"{what}: only people save or remove logins; an agent names a saved "
                            "account in browser_use login and never sees its password")

    async def save(self, caller: Caller, p: LoginSave) -> dict[str, Any]:
        self._person(caller, "login.save")
        ws_id = await self.rigs.workspace_for(caller, p.workspace)
        db = await self.rigs.stores.workspace(ws_id)
        sealed = await trio.to_thread.run_sync(self.vault.seal, ws_id, p.site, p.account, p.password)
        await self.rigs.stores.run(db.put_login, p.site, p.account, sealed, caller.user.id)
        return {"workspace": ws_id, "site": p.site, "account": p.account, "saved": True}

    async def listing(self, caller: Caller, workspace: str) -> list[dict[str, Any]]:
        ws_id = await self.rigs.workspace_for(caller, workspace)
        db = await self.rigs.stores.workspace(ws_id)
        return [{"site": site, "account": account, "createdBy": by, "createdAt": at}
                for site, account, by, at in await self.rigs.stores.run(db.list_logins)]

    async def remove(self, caller: Caller, p: LoginRef) -> dict[str, Any]:
        self._person(caller, "login.rm")
        ws_id = await self.rigs.workspace_for(caller, p.workspace)
        db = await self.rigs.stores.workspace(ws_id)
        if not await self.rigs.stores.run(db.delete_login, p.site, p.account):
            raise NotFound(f"no saved login for {p.account} at {p.site}")
        return {"workspace": ws_id, "site": p.site, "account": p.account, "removed": True}

    async def with_password(self, workspace_id: str, action: BrowserLogin) -> BrowserLogin:
        """``action`` with the saved password of its site and account in ``workspace_id``."""
        db = await self.rigs.stores.workspace(workspace_id)
        sealed = await self.rigs.stores.run(db.sealed_login, action.site, action.account)
        if sealed is None:
            raise FieldError("action.account", f"no saved login for {action.account} at {action.site} in "
                                               "this workspace (login.list shows the saved ones)")
        password = await trio.to_thread.run_sync(self.vault.open, workspace_id, action.site, action.account,
                                                 sealed)
        return replace(action, password=password)


__all__ = ["LoginRef", "LoginSave", "LoginVault", "Logins", "parse_account", "parse_login_ref",
           "parse_login_save", "parse_password", "parse_site"]
