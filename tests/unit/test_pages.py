"""The settings page's files (rigd.server.pages): served by rigd itself, with a strict
CSP, from the package; the shell for both page routes. Quart's test client: no sockets."""

from __future__ import annotations

import re

import pytest

from rigd.server.pages import CSP, HOME, WEB, load_assets
from tests.unit.test_lanes import World
from tests.unit.test_session import app_of

pytestmark = pytest.mark.trio


async def test_root_leads_to_the_rigs_screen(world: World) -> None:
    client = app_of(world).test_client()
    res = await client.get("/")
    assert res.status_code == 302
    assert res.headers["Location"] == HOME


async def test_both_page_routes_answer_the_shell_with_a_strict_policy(world: World) -> None:
    client = app_of(world).test_client()
    for path in (HOME, HOME + "/rig_abc123"):
        res = await client.get(path)
        assert res.status_code == 200, path
        body = await res.get_data()
        assert b'<script type="module" src="/static/app.js">' in body
        assert res.headers["Content-Security-Policy"] == CSP
        assert "frame-ancestors 'none'" in CSP and "script-src 'self'" in CSP
        assert res.headers["X-Content-Type-Options"] == "nosniff"
        assert res.headers["Referrer-Policy"] == "no-referrer"
    assert (await client.get(HOME + "/..%2f..%2fetc")).status_code == 404


async def test_static_files_have_types_and_etags_and_nothing_else_is_served(world: World) -> None:
    client = app_of(world).test_client()
    res = await client.get("/static/app.js")
    assert res.status_code == 200
    assert res.headers["Content-Type"].startswith("text/javascript")
    etag = res.headers["ETag"]
    again = await client.get("/static/app.js", headers={"If-None-Match": etag})
    assert again.status_code == 304
    assert (await client.get("/static/app.css")).headers["Content-Type"].startswith("text/css")
    for missing in ("/static/nope.js", "/static/..%2fshell.html", "/static/shell.html", "/static/"):
        assert (await client.get(missing)).status_code == 404, missing


async def test_the_page_is_small_self_contained_and_builds_no_markup_from_data() -> None:
    assets = load_assets()
    total = sum(len(a.body) for a in assets.values())
    assert total < 300 * 1024, total
    imports = set()
    for name, asset in assets.items():
        text = asset.body.decode()
        # Nothing external: no absolute URLs to other hosts in scripts, styles or the shell.
        # (an XML namespace names, it fetches nothing)
        plain = re.sub(r'xmlns="http://www\.w3\.org/[^"]*"', "", text).replace("https://…", "")
        assert not re.search(r"https?://[a-z0-9]", plain), name
        if name.endswith(".js"):
            assert not re.search(r"\.(innerHTML|outerHTML)\s*=|insertAdjacentHTML|document\.write", text), name
            assert "eval(" not in text and "new Function" not in text, name
            imports |= set(re.findall(r'from "\./([a-z0-9_-]+\.js)"', text))
    # Every module a script imports is served.
    assert imports and imports <= set(assets), imports - set(assets)
    assert (WEB / "shell.html").is_file()
