"""Server-sent events read as they pass: the proxy records an answer from the stream it forwards untouched."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any


class EventReader:
    """Splits a text/event-stream into (event name, data) as bytes arrive, in any chunking."""

    def __init__(self) -> None:
        self._buffer = b""
        self._event = ""
        self._data: list[str] = []

    def feed(self, data: bytes) -> Iterator[tuple[str, str]]:
        """The events completed by ``data``."""
        self._buffer += data
        while True:
            cut = self._line_end()
            if cut is None:
                return
            end, after = cut
            line = self._buffer[:end].decode("utf-8", "replace")
            self._buffer = self._buffer[after:]
            if not line:
                if self._data or self._event:
                    yield self._event, "\n".join(self._data)
                self._event, self._data = "", []
            elif line.startswith(":"):
                continue
            else:
                field, _, value = line.partition(":")
                value = value[1:] if value.startswith(" ") else value
                if field == "event":
                    self._event = value
                elif field == "data":
                    self._data.append(value)

    def _line_end(self) -> tuple[int, int] | None:
        """Where the first line ends and the next starts (CRLF, LF or CR); None while incomplete."""
        lf = self._buffer.find(b"\n")
        cr = self._buffer.find(b"\r")
        if cr == -1 or (lf != -1 and lf < cr):
            return None if lf == -1 else (lf, lf + 1)
        if cr == len(self._buffer) - 1:
            return None  # a CR at the end may be the first half of CRLF
        return (cr, cr + 2) if self._buffer[cr + 1:cr + 2] == b"\n" else (cr, cr + 1)


def json_events(reader: EventReader, data: bytes) -> Iterator[tuple[str, dict[str, Any]]]:
    """The events completed by ``data`` whose data is a JSON object (``[DONE]`` and junk are skipped)."""
    for name, text in reader.feed(data):
        if not text or text == "[DONE]":
            continue
        try:
            value = json.loads(text)
        except ValueError:
            continue
        if isinstance(value, dict):
            yield name or str(value.get("type") or ""), value
