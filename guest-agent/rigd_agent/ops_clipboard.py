"""The desktop's clipboard ops (protocol 2): ``clipboard_read`` and ``clipboard_write``
(text, images and file URIs; large payloads as streamed chunks).
"""

from __future__ import annotations

import binascii
import json
from typing import Any

from rigd_agent.base import BadRequest, Refused, field_bool, field_choice
from rigd_agent.core import AgentCore
from rigd_agent.desktop import decode_selection
from rigd_agent.files import DROP_B64_MAX
from rigd_agent.x11 import (
    IMAGE_TARGETS,
    INLINE_MAX,
    MAX_CLIPBOARD,
    MAX_CLIPBOARD_IMAGE,
    MEDIA_TYPES,
    SELECTIONS,
    field_accept,
    media_type,
)


class ClipboardOps(AgentCore):
    def op_clipboard_read(self, rid: int, req: dict[str, Any]) -> None:
        which = field_choice(req, "selection", tuple(SELECTIONS), default="clipboard")
        accept = field_accept(req)
        desk = self.need_desktop("clipboard_read")
        if "image" in accept:
            desk.need("clipboard_image")
        if "uris" in accept:
            desk.need("clipboard_files")
        got = desk.read_selection(which, accept)
        media = media_type(got["target"])
        if media in IMAGE_TARGETS:
            if got["truncated"]:
                raise Refused("image over 16 MiB")
            self.ok(rid, selection=which, owner=got["owner"], target=got["target"], bytes=len(got["data"]),
                    truncated=False, mediaType=media, targets=got["targets"],
                    **self.send_bulk(rid, got["data"]))  # fmt: skip
            return
        text = decode_selection(got["data"], got["target"])
        raw = text.encode("utf-8")
        if len(raw) > MAX_CLIPBOARD:  # a STRING owner's Latin-1 grew in UTF-8
            raw = raw[:MAX_CLIPBOARD].decode("utf-8", "ignore").encode("utf-8")
            text = raw.decode("utf-8")
            got["truncated"] = True
        fields: dict[str, Any] = {"selection": which, "owner": got["owner"], "target": got["target"],
                                  "bytes": len(raw), "truncated": got["truncated"], "mediaType": media,
                                  "targets": got["targets"]}  # fmt: skip
        if len(json.dumps(text)) <= INLINE_MAX:  # ASCII-only JSON: \uXXXX escapes count
            fields["text"] = text
        else:
            fields["chunks"] = self._chunks(rid, raw)  # UTF-8 bytes
        self.ok(rid, **fields)

    def op_clipboard_write(self, rid: int, req: dict[str, Any]) -> None:
        media = field_choice(req, "mediaType", MEDIA_TYPES, default="text/plain")
        if media in IMAGE_TARGETS:
            if req.get("text") is not None:
                raise BadRequest(f"text is not for {media}: send data")
            value = req.get("data")
            if not isinstance(value, str):
                raise BadRequest("data is required and must be a base64 string")
            if len(value) > DROP_B64_MAX:
                raise BadRequest(f"data is over {INLINE_MAX} bytes in one part")
            try:
                data = binascii.a2b_base64(value, strict_mode=True)
            except (binascii.Error, ValueError):
                raise BadRequest("data is not valid base64") from None
            if len(data) > INLINE_MAX:
                raise BadRequest(f"data is over {INLINE_MAX} bytes in one part")
            limit, feature = MAX_CLIPBOARD_IMAGE, "clipboard_image"
        else:
            if req.get("data") is not None:
                raise BadRequest(f"data is not for {media}: send text")
            text = req.get("text")
            if not isinstance(text, str):
                raise BadRequest("text is required and must be a string")
            try:
                data = text.encode("utf-8")
            except UnicodeEncodeError:
                raise BadRequest("text is not valid Unicode (lone surrogate)") from None
            limit = MAX_CLIPBOARD
            feature = "clipboard_write" if media == "text/plain" else "clipboard_files"
        which = field_choice(req, "selection", ("clipboard", "primary"), default="clipboard")
        continues = field_bool(req, "continues", default=False)
        desk = self.need_desktop("clipboard_write")
        desk.need(feature)
        # A payload too long for one request line comes in parts: every part
        # but the last says continues=true and is held (per selection) until then.
        with self.lock:
            held_media, held = self.clip_parts.pop(which, (media, bytearray()))
            if held_media != media:
                raise BadRequest(f"mediaType {media} does not continue the held {held_media} parts: dropped")
            total = len(held) + len(data)
            if total > limit:
                what = "data is" if media in IMAGE_TARGETS else "text is"
                unit = "bytes" if media in IMAGE_TARGETS else "bytes of UTF-8"
                raise BadRequest(f"{what} {total} {unit}, over the {limit}-byte limit")
            held += data
            if continues:
                self.clip_parts[which] = (media, held)
                self.ok(rid, selection=which, bytes=total, pending=True, mediaType=media)
                return
        desk.write_selection(which, bytes(held), media)
        self.ok(rid, selection=which, bytes=total, pending=False, mediaType=media)

