"""What a Chromium DevTools endpoint says about itself (``GET /json/version``), parsed.

Sans-I/O: bytes in, a typed value out. The bytes come from inside a guest
(through the agent's exec of curl on guest loopback), so they are hostile:
capped, decoded strictly, and every field is checked before it is believed.
"""

from __future__ import annotations

import base64
import binascii
import io
import json
from dataclasses import dataclass
from urllib.parse import urlsplit

from PIL import Image

from rigd.errors import RigdError
from rigd.protocols.cdp import BROWSER_PATH, CDPProtocolError

#: A real answer is ~500 bytes; anything past this is not DevTools.
MAX_VERSION_BYTES = 16 * 1024


@dataclass(frozen=True, slots=True)
class DevToolsVersion:
    #: e.g. "Chrome/156.0.8078.114" (headless=new names itself Chrome, not HeadlessChrome).
    browser: str
    protocol: str
    user_agent: str
    #: ws://127.0.0.1:<port>/devtools/browser/<id> (a guest-side address).
    websocket_url: str

    @property
    def product(self) -> str:
        """The product before the slash ("Chrome", "HeadlessChrome")."""
        return self.browser.split("/", 1)[0]

    @property
    def browser_path(self) -> str:
        """The browser endpoint's path (``/devtools/browser/<uuid>``), checked: the
        host connects to its own relay with it, never to the address the guest named."""
        path = urlsplit(self.websocket_url).path
        if not BROWSER_PATH.fullmatch(path):
            raise RigdError("DevTools webSocketDebuggerUrl has no /devtools/browser/<id> path",
                            field="webSocketDebuggerUrl")
        return path



def parse_version(data: bytes) -> DevToolsVersion:
    """Parse a ``/json/version`` body; a RigdError says what was wrong."""
    if len(data) > MAX_VERSION_BYTES:
        raise RigdError(f"DevTools /json/version answer is {len(data)} bytes (at most {MAX_VERSION_BYTES})")
    try:
        doc = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise RigdError(f"DevTools /json/version answer is not JSON: {exc}") from exc
    if not isinstance(doc, dict):
        raise RigdError("DevTools /json/version answer is not a JSON object")
    fields: dict[str, str] = {}
    for key in ("Browser", "Protocol-Version", "User-Agent", "webSocketDebuggerUrl"):
        value = doc.get(key)
        if not isinstance(value, str) or not value or len(value) > 1024:
            raise RigdError(f"DevTools /json/version answer has no usable {key!r}", field=key)
        fields[key] = value
    if not fields["webSocketDebuggerUrl"].startswith("ws://"):
        raise RigdError("DevTools webSocketDebuggerUrl is not a ws:// URL", field="webSocketDebuggerUrl")
    return DevToolsVersion(browser=fields["Browser"], protocol=fields["Protocol-Version"],
                           user_agent=fields["User-Agent"], websocket_url=fields["webSocketDebuggerUrl"])


#: A screencast frame's JPEG is at most this big (a 2560x1600 page at quality 70 is ~1 MB).
MAX_CAST_BYTES = 8 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class CastFrame:
    """One ``Page.screencastFrame``: the JPEG, its size (read from the JPEG itself, not
    from what the page claims), and the id to ack it with."""

    data: bytes
    width: int
    height: int
    ack: int


def parse_cast_frame(params: dict[str, object]) -> CastFrame:
    """Check a ``Page.screencastFrame`` event's params; a RigdError says what was wrong."""
    raw = params.get("data")
    ack = params.get("sessionId")
    if not isinstance(ack, int) or isinstance(ack, bool) or not 0 <= ack < 2**31:
        raise RigdError("screencast frame without a usable sessionId", field="sessionId")
    if not isinstance(raw, str) or len(raw) > MAX_CAST_BYTES * 4 // 3 + 4:
        raise RigdError("screencast frame data is missing or over the cap", field="data")
    try:
        data = base64.b64decode(raw, validate=True)
    except (ValueError, binascii.Error) as exc:
        raise RigdError("screencast frame data is not base64", field="data") from exc
    width, height = jpeg_size(data, "screencast frame")
    return CastFrame(data, width, height, ack)


def jpeg_size(data: bytes, where: str) -> tuple[int, int]:
    """The size of a JPEG a browser sent (its header only is read); anything else is a
    :class:`~rigd.protocols.cdp.CDPProtocolError` naming ``where``."""
    try:
        with Image.open(io.BytesIO(data)) as img:
            if img.format != "JPEG":
                raise CDPProtocolError(f"{where}: the image is not a JPEG", field="data")
            return img.size
    except (OSError, Image.DecompressionBombError) as exc:
        raise CDPProtocolError(f"{where}: the image does not decode", field="data") from exc
