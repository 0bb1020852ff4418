"""Log set-up: one line per event with its structured fields as ``key=value``.

Loggers are ``rigd.<area>`` and one per rig (``rigd.rig.<rigId>``). Fields
come from ``extra=``; nothing a user typed and no secret is ever passed there.
"""

from __future__ import annotations

import logging

_STANDARD = set(vars(logging.LogRecord("x", 0, "x", 0, "x", None, None))) | {"message", "asctime"}


class FieldsFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        fields = {k: v for k, v in vars(record).items() if k not in _STANDARD}
        if fields:
            line += " " + " ".join(f"{k}={v!r}" if isinstance(v, str) and " " in v else f"{k}={v}"
                                   for k, v in sorted(fields.items()))
        return line


def setup(level: str) -> None:
    handler = logging.StreamHandler()
    handler.setFormatter(FieldsFormatter("%(asctime)s %(levelname)s %(name)s %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
