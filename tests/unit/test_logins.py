"""Saved logins (issue 30, rigd.rigs.logins) over the fake backend: sealed at rest with a key
outside the database, saved and removed by people only, listed without passwords, looked up
for browser_use login into the parsed action only; bad input is a field error that saves
nothing. The driver's side (origin checks, the fill script) is in test_marks' scripted page."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest
import trio

import rigd.verbs.browser as bv
from rigd.browser.marks import LOGIN_FILL
from rigd.errors import Conflict, FieldError, Forbidden, NotFound, RigdError
from rigd.rigs.logins import LoginVault, parse_password
from tests.unit import test_seats
from tests.unit.test_marks import ScriptedPage
from tests.unit.test_pressure import World

pytestmark = pytest.mark.timeout(30)
#: The fixture: a world whose rigs have a fake browser backend too (test_seats's).
world = test_seats.world

PASSWORD = "correct horse battery staple ✓"


async def call(world: World, method: str, caller: Any, **params: Any) -> Any:
    return await world.api.call(method, caller, {"workspace": "default", **params})


@pytest.mark.parametrize(("site", "want"), [
    ("https://Accounts.Example.com", "https://accounts.example.com"),
    ("https://a.test:443/", "https://a.test"),
    ("https://a.test:8443", "https://a.test:8443"),
])
def test_a_site_is_an_https_origin(site: str, want: str) -> None:
    assert bv.parse_site(site) == want


@pytest.mark.parametrize(("site", "words"), [
    ("http://a.test", "https:// origin"), ("a.test", "https:// origin"), ("https://a.test/login", "origin only"),
    ("https://u:p@a.test", "origin only"), ("https://a.test?x=1", "origin only"), ("https://a.test:99999", "port"),
    ("", "https:// origin"), (7, "https:// origin"),
])
def test_a_site_that_is_not_an_https_origin_is_a_field_error(site: object, words: str) -> None:
    with pytest.raises(FieldError, match=words) as e:
        bv.parse_site(site)
    assert e.value.field == "site"


@pytest.mark.parametrize(("password", "words"), [
    ("", "non-empty"), ("a\0b", "NUL"), ("x" * 1025, "at most 1024 bytes"), ("é" * 513, "at most 1024 bytes"),
    (None, "non-empty"),
])
def test_a_bad_password_is_a_field_error(password: object, words: str) -> None:
    with pytest.raises(FieldError, match=words) as e:
        parse_password(password)
    assert e.value.field == "password"


def test_sealed_with_a_key_outside_the_database_bound_to_its_place(tmp_path: Path) -> None:
    vault = LoginVault(tmp_path)
    sealed = vault.seal("ws1", "https://a.test", "ada", PASSWORD)
    assert PASSWORD.encode() not in sealed and vault.open("ws1", "https://a.test", "ada", sealed) == PASSWORD
    assert (tmp_path / "logins" / "key").stat().st_mode & 0o777 == 0o600
    assert (tmp_path / "logins").stat().st_mode & 0o777 == 0o700
    for moved in (("ws2", "https://a.test", "ada"), ("ws1", "https://b.test", "ada"), ("ws1", "https://a.test", "bob")):
        with pytest.raises(RigdError, match="does not open"):
            vault.open(*moved, sealed)
    with pytest.raises(RigdError, match="not a sealed login"):
        vault.open("ws1", "https://a.test", "ada", b"plain")


async def test_people_save_and_remove_agents_list_accounts_only(world: World) -> None:
    saved = await call(world, "login.save", world.person, site="https://Accounts.Test", account="ada",
                       password=PASSWORD)
    assert saved == {**saved, "site": "https://accounts.test", "account": "ada", "saved": True}
    assert "password" not in json.dumps(saved)
    with pytest.raises(Forbidden, match="only people"):
        await call(world, "login.save", world.agent, site="https://a.test", account="bot", password="x")
    with pytest.raises(Forbidden, match="only people"):
        await call(world, "login.rm", world.agent, site="https://accounts.test", account="ada")
    listed = await call(world, "login.list", world.agent)
    assert [(x["site"], x["account"]) for x in listed] == [("https://accounts.test", "ada")]
    assert PASSWORD not in json.dumps(listed)
    # Saving again replaces; bad input saves nothing and names the field.
    await call(world, "login.save", world.person, site="https://accounts.test", account="ada", password="new")
    for params, field in (({"site": "http://accounts.test", "account": "eve", "password": "x"}, "site"),
                          ({"site": "https://accounts.test", "account": "eve", "password": "a\0"}, "password"),
                          ({"site": "https://accounts.test", "account": "", "password": "x"}, "account"),
                          ({"site": "https://accounts.test", "account": "eve", "password": "x", "pw": 1}, "pw")):
        with pytest.raises(FieldError) as e:
            await call(world, "login.save", world.person, **params)
        assert e.value.field == field
    assert len(await call(world, "login.list", world.person)) == 1
    # The password is nowhere in the workspace's database in the clear.
    ws_db = next(world.stores.data_dir.rglob("*.db"))
    for db in world.stores.data_dir.rglob("*.db"):
        assert PASSWORD.encode() not in db.read_bytes() and b"new" not in _logins_plain(db)
    assert ws_db.exists()
    assert (await call(world, "login.rm", world.person, site="https://accounts.test", account="ada"))["removed"]
    with pytest.raises(NotFound):
        await call(world, "login.rm", world.person, site="https://accounts.test", account="ada")
    assert await call(world, "login.list", world.person) == []


def _logins_plain(db: Path) -> bytes:
    """Every login row's columns but the sealed blob, as bytes (nothing else may hold it)."""
    with sqlite3.connect(db) as conn:
        try:
            rows = conn.execute("SELECT site, account, created_by, created_at FROM logins").fetchall()
        except sqlite3.OperationalError:
            return b""
    return json.dumps(rows).encode()


async def test_browser_use_login_hands_the_password_to_the_machine_only(world: World) -> None:
    await call(world, "login.save", world.person, site="https://accounts.test", account="ada", password=PASSWORD)
    rig = await world.open(None, surface="browser")
    machine = world.browser.machines[-1]  # type: ignore[attr-defined]
    await world.api.call("rig.act", world.agent, {"rigId": rig["id"], "tool": "browser_use", "action": {
        "action": "login", "site": "https://accounts.test", "account": "ada"}})
    [action] = [a for a in machine.actions if a.verb == "login"]
    assert action.password == PASSWORD and PASSWORD not in repr(action)
    log = await world.api.call("rig.log", world.person, {"rigId": rig["id"]})
    assert "ada" in json.dumps(log) and PASSWORD not in json.dumps(log)
    for params, field in (({"site": "https://accounts.test", "account": "bob"}, "action.account"),
                          ({"site": "http://accounts.test", "account": "ada"}, "action.site"),
                          ({"site": "https://accounts.test", "account": "ada", "password": "x"}, "action.password")):
        with pytest.raises(FieldError) as e:
            await world.api.call("rig.act", world.agent, {"rigId": rig["id"], "tool": "browser_use",
                                                         "action": {"action": "login", **params}})
        assert e.value.field == field
    assert [a.verb for a in machine.actions].count("login") == 1


class LoginPage(ScriptedPage):
    """A scripted page at ``url`` whose login form the fill script reports on."""

    def __init__(self, url: str) -> None:
        super().__init__()
        self.url = url
        self.filled: list[tuple[str, str]] = []

    async def _page_url(self) -> str:
        return self.url

    async def _value(self, expression: str, *, timeout: float | None = None) -> Any:
        if expression.startswith(f"({LOGIN_FILL})("):
            args = json.loads("[" + expression[len(LOGIN_FILL) + 3:-1] + "]")
            self.filled.append((args[0], args[1]))
            return {"found": True, "username": True, "form": True}
        return await super()._value(expression, timeout=timeout)


def test_the_driver_fills_only_its_own_sites_https_page() -> None:
    async def main() -> None:
        good = LoginPage("https://accounts.test/signin?next=/")
        out = await good.perform(bv.BrowserLogin("https://accounts.test", "ada", PASSWORD))
        assert out == {"site": "https://accounts.test", "account": "ada", "filled": True, "usernameField": True}
        assert good.filled == [("ada", PASSWORD)] and PASSWORD not in json.dumps(out)
        for url, words in (("http://accounts.test/signin", "not https"),
                           ("https://accounts.test.evil.test/", "not https://accounts.test"),
                           ("https://accounts.test:8443/", "not https://accounts.test"),
                           ("file:///tmp/start.html", "not https")):
            page = LoginPage(url)
            with pytest.raises(Conflict, match=words) as e:
                await page.perform(bv.BrowserLogin("https://accounts.test", "ada", PASSWORD))
            assert e.value.data["field"] == "action.site" and page.filled == []
            assert PASSWORD not in e.value.message

    trio.run(main)
