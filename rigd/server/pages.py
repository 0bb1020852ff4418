"""The settings page: ``/`` → ``/settings/server/rigs``, the page shell, and its files.

Everything the page needs is served by rigd itself from ``rigd/web/``:
no CDN, no Node, no build step. The files are read once at start-up
(they are part of the package, a few tens of KB) and answered with a
content hash as ``ETag``.

Routes:

- ``GET /`` → ``302 /settings/server/rigs``;
- ``GET /settings/server/rigs`` (the rigs screen) and
  ``GET /settings/server/rigs/<rigId>`` (a rig's tab: live view, terminal,
  audit log) → the one HTML shell; the page's script reads the path;
- ``GET /static/<name>`` → one of the files in ``rigd/web/static/``.

The shell needs no sign-in to load: it holds no data. Every byte of data
comes from the RPC and the lanes, which check the session cookie (and the
``Origin`` of every state change). The answers carry a strict
``Content-Security-Policy`` (scripts, styles and connections to this origin
only; no framing), ``X-Content-Type-Options: nosniff`` and
``Referrer-Policy: no-referrer`` (signed URLs never leak through a
``Referer``).
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path

from quart import Response, request
from quart_trio import QuartTrio

WEB = Path(__file__).resolve().parent.parent / "web"
HOME = "/settings/server/rigs"

CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' blob: data:; "
       "connect-src 'self'; font-src 'self'; form-action 'self'; base-uri 'none'; "
       "frame-ancestors 'none'")
SECURITY_HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
    "Cross-Origin-Opener-Policy": "same-origin",
}
TYPES = {".js": "text/javascript; charset=utf-8", ".css": "text/css; charset=utf-8",
         ".svg": "image/svg+xml", ".html": "text/html; charset=utf-8", ".png": "image/png"}
_NAME = re.compile(r"^[a-z0-9][a-z0-9_-]{0,63}\.(js|css|svg|png)$")
_RIG_ID = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


@dataclass(frozen=True, slots=True)
class Asset:
    body: bytes
    content_type: str
    etag: str


def load_assets(root: Path = WEB) -> dict[str, Asset]:
    """The shell (``""``) and every file of ``static/``, by name."""
    assets: dict[str, Asset] = {}
    files = [("", root / "shell.html")]
    files += [(p.name, p) for p in sorted((root / "static").iterdir()) if _NAME.match(p.name)]
    for name, path in files:
        body = path.read_bytes()
        assets[name] = Asset(body, TYPES[path.suffix], '"' + hashlib.sha256(body).hexdigest()[:32] + '"')
    return assets


def _answer(asset: Asset) -> Response:
    if request.headers.get("If-None-Match") == asset.etag:
        response = Response(b"", status=304)
    else:
        response = Response(asset.body, status=200, content_type=asset.content_type)
    response.headers["ETag"] = asset.etag
    response.headers["Cache-Control"] = "no-cache"
    for name, value in SECURITY_HEADERS.items():
        response.headers[name] = value
    return response


def register_pages(app: QuartTrio, assets: dict[str, Asset] | None = None) -> None:
    files = assets if assets is not None else load_assets()
    shell = files[""]

    @app.get("/")
    async def root() -> Response:
        response = Response(b"", status=302)
        response.headers["Location"] = HOME
        return response

    @app.get(HOME)
    async def rigs_screen() -> Response:
        return _answer(shell)

    @app.get(HOME + "/<rig_id>")
    async def rig_tab(rig_id: str) -> Response:
        if not _RIG_ID.match(rig_id):
            return Response("no such page", status=404, content_type="text/plain")
        return _answer(shell)

    @app.get("/static/<name>")
    async def static_file(name: str) -> Response:
        asset = files.get(name) if name else None
        if asset is None:
            return Response("no such file", status=404, content_type="text/plain")
        return _answer(asset)


__all__ = ["CSP", "HOME", "load_assets", "register_pages"]
