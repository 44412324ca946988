"""What a scripted fake model answers: a ``Reply`` (text, tool calls, thinking, usage, errors, timing), wire-neutral."""

from __future__ import annotations

import dataclasses
import itertools
import json
from collections.abc import Iterator
from typing import Any

DEFAULT_TEXT = "This is a fake summary."


@dataclasses.dataclass(frozen=True)
class ToolCall:
    """One tool call the model makes."""

    name: str
    arguments: Any = dataclasses.field(default_factory=dict)
    """The arguments: a JSON-able value, or a str sent as the arguments' JSON text as it is."""
    namespace: str | None = None
    """Responses API: the namespace of a grouped tool (Codex's ``mcp__<server>``); other APIs ignore it."""
    id: str | None = None
    """The call id; a fresh one when None."""

    @property
    def arguments_json(self) -> str:
        """The arguments as JSON text."""
        return self.arguments if isinstance(self.arguments, str) else json.dumps(self.arguments)


@dataclasses.dataclass(frozen=True)
class Usage:
    """Token figures the reply reports; None figures are estimated (characters / 4)."""

    input: int | None = None
    """Input tokens neither read from nor written to the cache (Anthropic's ``input_tokens``); OpenAI's
    ``input_tokens``/``prompt_tokens`` are this plus ``cache_read`` and ``cache_write``."""
    output: int | None = None
    cache_read: int = 0
    """Cached input tokens read (Anthropic ``cache_read_input_tokens``, OpenAI ``cached_tokens``)."""
    cache_write: int = 0
    """Input tokens written to the cache (Anthropic ``cache_creation_input_tokens``)."""


@dataclasses.dataclass(frozen=True)
class Reply:
    """How the fake answers one model request, in whichever API it was asked."""

    text: str | None = None
    """The answer's text; None is the default text, or no text when the reply makes tool calls."""
    tool_calls: tuple[ToolCall | tuple[str, str, str], ...] = ()
    """Tool calls after the text; an ``(id, name, arguments JSON)`` triple is read as a ``ToolCall``."""
    thinking: str | None = None
    """Thinking before the answer (Anthropic thinking block, Responses reasoning item, Chat ``reasoning_content``)."""
    signature: str | None = None
    """The thinking block's signature; a made-up one when None and there is thinking."""
    usage: Usage | None = None
    finish_reason: str = "stop"
    """``stop`` or ``length`` (mapped to each API's words); tool calls always finish as tool calls."""
    status: int = 200
    """Anything but 200 answers with the API's error body."""
    error_type: str | None = None
    """The error's type (Anthropic ``overloaded_error``, OpenAI ``server_error`` …); by status when None."""
    error_message: str = "The server had an error while processing your request."
    headers: tuple[tuple[str, str], ...] = ()
    """Extra response headers, e.g. (("retry-after", "0"),)."""
    delay: float = 0.0
    """Seconds to wait before answering."""
    chunk_delay: float = 0.0
    """Streaming only: seconds to wait before each delta event."""
    chunks: tuple[str, ...] | None = None
    """Streaming only: the text's pieces; by default the text is split every few words."""
    empty: bool = False
    """Answer with empty content."""
    malformed: bool = False
    """Answer 200 with a body (or stream event) that is not valid JSON."""
    hang: bool = False
    """Never answer; the connection is dropped when the server stops."""
    drop_after: int | None = None
    """Streamed: cut the connection after this many events, mid-stream; not streamed: cut it without an answer."""
    stream_error: str | None = None
    """Streaming only: after the content, send the API's error event with this message instead of finishing."""

    @property
    def calls(self) -> tuple[ToolCall, ...]:
        """The tool calls, each a ``ToolCall``."""
        return tuple(c if isinstance(c, ToolCall) else ToolCall(id=c[0], name=c[1], arguments=c[2])
                     for c in self.tool_calls)

    @property
    def answer(self) -> str:
        """The text actually sent."""
        if self.empty:
            return ""
        if self.text is None:
            return "" if self.tool_calls else DEFAULT_TEXT
        return self.text

    def pieces(self) -> list[str]:
        """The text's streamed pieces."""
        if self.empty:
            return []
        return list(self.chunks) if self.chunks is not None else list(split(self.answer))


@dataclasses.dataclass(frozen=True)
class Event:
    """One server-sent event; ``data`` is JSON-able or a str sent as it is."""

    name: str | None
    data: Any
    delta: bool = False
    """A content delta: ``chunk_delay`` is waited before it."""

    def encode(self) -> bytes:
        """The event as it goes on the wire."""
        data = self.data if isinstance(self.data, str) else json.dumps(self.data, separators=(",", ":"))
        return ((f"event: {self.name}\n" if self.name else "") + f"data: {data}\n\n").encode("utf-8")


def split(text: str, size: int = 24) -> Iterator[str]:
    """``text`` in pieces of about ``size`` characters, split after spaces where possible."""
    start = 0
    while start < len(text):
        end = min(len(text), start + size)
        space = text.rfind(" ", start, end)
        if end < len(text) and space > start:
            end = space + 1
        yield text[start:end]
        start = end


def halves(text: str) -> list[str]:
    """``text`` in two pieces (one when it is short), as providers stream tool arguments in parts."""
    middle = len(text) // 2
    return [text] if middle < 2 else [text[:middle], text[middle:]]


_counter = itertools.count(1)


def new_id(prefix: str) -> str:
    """A fresh id with the provider's prefix, unique in this process."""
    return f"{prefix}{next(_counter):024d}"


def fake_signature(thinking: str) -> str:
    """A made-up thinking signature, stable for the same thinking."""
    import base64
    import hashlib

    return base64.b64encode(hashlib.sha256(thinking.encode("utf-8")).digest() * 3).decode("ascii")


def estimate(chars: int) -> int:
    """Tokens for this many characters, as the fake counts them."""
    return chars // 4


def resolved_usage(reply: Reply, prompt_chars: int) -> Usage:
    """The reply's usage with every figure filled in."""
    given = reply.usage or Usage()
    output_chars = len(reply.answer) + len(reply.thinking or "") + sum(len(c.arguments_json) for c in reply.calls)
    return Usage(input=given.input if given.input is not None else estimate(prompt_chars),
                 output=given.output if given.output is not None else estimate(output_chars),
                 cache_read=given.cache_read, cache_write=given.cache_write)
