"""LSP base-protocol framing that survives bad input.

pygls' own reader hangs on a wrong Content-Length and drops bodies that are
not JSON. This one answers what can be answered and resynchronises on the
next ``Content-Length`` header after a framing error.
"""

from __future__ import annotations

import json
import os
import re
import threading
from typing import TYPE_CHECKING, Any

import attrs

if TYPE_CHECKING:
    import asyncio  # not imported at run time: rpc/startup.py reads frames before anything heavy loads

_HEADER = re.compile(rb"Content-Length:[ \t]*(\d+)[ \t]*\r\n", re.IGNORECASE)
_HEADER_END = b"\r\n\r\n"
MAX_BODY = 256 * 1024 * 1024
_HEADER_LINE_MAX = 64


@attrs.define(frozen=True)
class Frame:
    """A decoded JSON body, or why it could not be decoded."""

    message: Any = None
    error: str | None = None
    too_deep_id: Any = None
    """For valid JSON nested too deeply to decode: the request id found by a shallow scan, if any."""


@attrs.define
class FrameReader:
    """Splits a byte stream into frames; call ``feed`` with bytes and ``frames`` to drain."""

    buffer: bytearray = attrs.field(factory=bytearray)
    discarded: int = 0
    """Bytes skipped while looking for a header, since the last frame."""

    def feed(self, data: bytes) -> None:
        """Add bytes read from the stream."""
        self.buffer += data

    def frames(self, stalled: bool = False) -> list[Frame]:
        """Every complete frame in the buffer; ``stalled`` means no more bytes are coming soon."""
        out: list[Frame] = []
        while True:
            frame = self._next(stalled)
            if frame is None:
                return out
            out.append(frame)

    def _next(self, stalled: bool) -> Frame | None:
        match = _HEADER.search(self.buffer)
        if match is None:
            # Keep what may be the start of a header still arriving; anything before it is junk.
            if len(self.buffer) > _HEADER_LINE_MAX:
                self._discard(len(self.buffer) - _HEADER_LINE_MAX)
            return None
        if match.start() > 0:
            self._discard(match.start())
            return self._next(stalled)
        end = self.buffer.find(_HEADER_END, match.end() - 2)
        if end < 0:
            return None
        length = int(match.group(1))
        start = end + len(_HEADER_END)
        if length > MAX_BODY:
            self._discard(start)
            return Frame(error=f"Content-Length {length} exceeds the limit of {MAX_BODY} bytes")
        body = bytes(self.buffer[start : start + length])
        if len(body) == length:
            decoded = _decode(body)
            if decoded.error is not None and (cut := _cut_at_header(body)) is not None:
                # Declared longer than sent: the next message's header sits inside this body.
                del self.buffer[: start + cut[0]]
                return cut[1]
            del self.buffer[: start + length]
            return decoded
        if not stalled:
            return None
        # Input stalled short of the declared length: judge what came.
        cut = _cut_at_header(body)
        if cut is not None:
            del self.buffer[: start + cut[0]]
            return cut[1]
        del self.buffer[: start + len(body)]
        decoded = _decode(body)
        if decoded.error is None or not body:
            return decoded if body else None
        return Frame(error=f"body shorter than its Content-Length ({len(body)} of {length} bytes)")

    def _discard(self, count: int) -> None:
        self.discarded += count
        del self.buffer[:count]


def _cut_at_header(body: bytes) -> tuple[int, Frame] | None:
    """Where a header inside ``body`` ends a valid JSON prefix: (offset, frame), or None."""
    for match in _HEADER.finditer(body):
        decoded = _decode(body[: match.start()])
        if decoded.error is None:
            return match.start(), decoded
    return None


def _decode(body: bytes) -> Frame:
    try:
        return Frame(message=json.loads(body))
    except RecursionError:
        return Frame(error="JSON nested too deeply", too_deep_id=_shallow_id(body))
    except ValueError as error:
        return Frame(error=f"body is not UTF-8 JSON: {error}")


_ID = re.compile(rb'"id"\s*:\s*(-?\d+|"(?:[^"\\]|\\.)*")')


def _shallow_id(body: bytes) -> Any:
    """The request id of a body too deep to decode, looked for before its params begin."""
    head = body.split(b'"params"', 1)[0]
    match = _ID.search(head)
    if match is None:
        return None
    try:
        return json.loads(match.group(1))
    except ValueError:
        return None


def take_frames(buffer: bytearray) -> list[bytes]:
    """Whole frames, raw, at the front of a well-framed stream (a host's output); they leave the buffer."""
    frames: list[bytes] = []
    while True:
        end = buffer.find(_HEADER_END)
        if end < 0:
            return frames
        match = _HEADER.search(buffer, 0, end + 2)
        total = end + len(_HEADER_END) + (int(match.group(1)) if match else 0)
        if len(buffer) < total:
            return frames
        frames.append(bytes(buffer[:total]))
        del buffer[:total]


def frame_body(body: bytes) -> bytes:
    """A UTF-8 JSON body with its Content-Length header: the one place messages are framed."""
    return b"Content-Length: %d\r\n\r\n%s" % (len(body), body)


LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def encode(message: Any) -> bytes:
    """One message, as JSON, framed."""
    text = json.dumps(message, ensure_ascii=False, separators=(",", ":"))
    try:
        return frame_body(text.encode("utf-8"))
    except UnicodeEncodeError:
        # A lone surrogate (a JSON escape of half a character) has no UTF-8: it is sent as U+FFFD.
        return frame_body(LONE_SURROGATE.sub("\ufffd", text).encode("utf-8"))


def _pump(fd: int, loop: asyncio.AbstractEventLoop, chunks: asyncio.Queue[bytes]) -> None:
    """Copy stdin into ``chunks``; an empty chunk means end of input."""
    while True:
        try:
            data = os.read(fd, 1 << 16)
        except OSError:
            data = b""
        try:
            loop.call_soon_threadsafe(chunks.put_nowait, data)
        except RuntimeError:
            return  # the loop has closed: the server is exiting
        if not data:
            return


def watch_input(fd: int, loop: asyncio.AbstractEventLoop, chunks: asyncio.Queue[bytes]) -> bool:
    """Feed stdin into ``chunks`` from the loop when it can (returns True), else from a thread.

    On the loop, a message costs no hand-over between threads: 0.1-0.15 ms of a round trip. A thread
    where the loop cannot watch the descriptor (Windows pipes, regular files): a daemon, so that a
    client that keeps stdin open after exit cannot hold the process.
    """
    def readable() -> None:
        try:
            data = os.read(fd, 1 << 16)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            loop.remove_reader(fd)
        chunks.put_nowait(data)

    try:
        loop.add_reader(fd, readable)
        return True
    except (NotImplementedError, OSError, ValueError):
        threading.Thread(target=_pump, args=(fd, loop, chunks), daemon=True, name="stdin-reader").start()
        return False
