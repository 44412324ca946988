"""What every provider format gives the proxy's core: the adapter interface and the values it passes around.

An adapter reads a request body (its conversation as ``Unit``s: the provider's own JSON of each message, verbatim),
converts a unit to the sidecar's messages (OpenAI Chat messages, ``parts``), renders an assembled context back in
its format from the stored originals, records a streamed or plain answer, and writes errors as its API does.
"""

from __future__ import annotations

import abc
import hashlib
from collections.abc import Sequence
from typing import Any, ClassVar

import attrs

from sidecar.engine.tokens import estimate_bytes_tokens
from sidecar.proxy.body import Body, BodyError, read_body
from sidecar.proxy.jsontext import JsonTextError


class BadRequest(Exception):
    """A body the provider would refuse with 400; ``message`` says why, as the provider's error would."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


REPLY_LIMITS = ("max_tokens", "max_completion_tokens", "max_output_tokens")
"""Anthropic's and Chat's, Chat's newer one, Responses'."""


@attrs.define
class Request:
    """A request body as read (see ``body.Body``): its top-level members and its conversation's elements."""

    body: Body

    @property
    def values(self) -> dict[str, Any]:
        """Top-level members; the conversation's member lists its elements' values (None: taken unread)."""
        return self.body.values

    @property
    def model(self) -> str | None:
        """The model asked for."""
        model = self.values.get("model")
        return model if isinstance(model, str) else None

    @property
    def stream(self) -> bool:
        """Whether the answer is streamed."""
        return self.values.get("stream") is True

    @property
    def overhead_tokens(self) -> int:
        """Tokens of the body outside the conversation: system prompt, tools, settings."""
        span = self.body.span or (0, 0)
        return estimate_bytes_tokens(len(self.body.raw) - (span[1] - span[0]))

    @property
    def reply_tokens(self) -> int | None:
        """The most tokens the answer may take, as the request says (each API has its own name for it)."""
        for name in REPLY_LIMITS:
            value = self.values.get(name)
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                return value
        return None


@attrs.define
class Unit:
    """One entry of the conversation as the provider has it, and the unit of identity and of originals.

    An Anthropic or Chat message, or a run of Responses items that make one assistant turn. ``texts`` are the
    provider's JSON of each, verbatim but for cache markers; the sidecar stores them as the first part's
    ``original``, and renders from them.
    """

    texts: tuple[str, ...]
    values: tuple[Any, ...]


@attrs.define
class Item:
    """One entry of an assembled context as the renderer sees it."""

    kind: str
    """``message`` or ``summary``."""
    id: str
    message: dict[str, Any]
    """The sidecar's OpenAI message for it (the summary's text, a pruned output's placeholder, kept tool calls)."""
    pruned: bool = False


@attrs.define
class Recorded:
    """An answer taken from the upstream's response: the assistant unit and the provider's usage."""

    unit: Unit | None
    input_tokens: int | None = None
    output_tokens: int | None = None
    cache_read_tokens: int | None = None
    cache_write_tokens: int | None = None


def unit_id(parent: str, identity: str) -> str:
    """A unit's id: chained on its parent's, so that an edited or rewound conversation gets new ids from there on."""
    # surrogatepass: a JSON escape of half a character (truncated tool output) is valid JSON, not valid UTF-8.
    digest = hashlib.blake2b(f"{parent}\n{identity}".encode("utf-8", "surrogatepass"), digest_size=12).hexdigest()
    return f"px-{digest}"


def part_id(unit: str, index: int, count: int) -> str:
    """The sidecar message id of a unit's part: the unit's own id when it is the only one."""
    return unit if count == 1 else f"{unit}.{index}"


def split_part_id(message_id: str) -> tuple[str, int] | None:
    """(unit id, part index) of a proxy message id, None for a message some other client stored."""
    if not message_id.startswith("px-"):
        return None
    unit, _, index = message_id.partition(".")
    if not index:
        return unit, 0
    return (unit, int(index)) if index.isdigit() else None


class Recorder(abc.ABC):
    """Takes a response's bytes as they pass, and tells at the end what the answer was."""

    @abc.abstractmethod
    def feed(self, data: bytes) -> None:
        """Bytes of the response body as they arrive."""

    @abc.abstractmethod
    def finish(self) -> Recorded | None:
        """The answer, or None when the response did not hold a complete one."""


class BodyRecorder(Recorder):
    """An answer from a plain JSON response, read once the whole body has passed."""

    def __init__(self) -> None:
        self._body = bytearray()

    def feed(self, data: bytes) -> None:
        self._body += data

    def finish(self) -> Recorded | None:
        try:
            return self.answer(self._body.decode())
        except (UnicodeDecodeError, JsonTextError):
            return None

    @abc.abstractmethod
    def answer(self, text: str) -> Recorded | None:
        """The answer in the body's text; None (or JsonTextError) when it holds none."""


class Adapter(abc.ABC):
    """A provider format."""

    name: ClassVar[str]
    conversation_key: ClassVar[str]
    """The top-level member that holds the conversation: ``messages`` or ``input``."""

    def read(self, raw: bytes, previous: Sequence[Body] = ()) -> Request:
        """The request; its conversation's leading elements that are a previous body's are taken unread."""
        try:
            body = read_body(raw, self.conversation_key, previous)
        except BodyError as error:
            raise BadRequest(str(error)) from None
        if body.span is None:
            raise BadRequest(f"{self.conversation_key}: field required")
        request = Request(body)
        if self.manageable(body.values):
            self.check(request)
        return request

    def manageable(self, values: dict[str, Any]) -> bool:
        """Whether the proxy assembles this request's conversation (else it goes upstream as it is)."""
        return True

    @abc.abstractmethod
    def check(self, request: Request) -> None:
        """Raise BadRequest for a conversation of the wrong shape (its elements from ``request.body.reused`` on: the
        others were checked in an earlier request)."""

    @abc.abstractmethod
    def clean(self, value: Any, text: str) -> tuple[Any, str]:
        """An element without the agent's cache markers, value and text (text verbatim otherwise)."""

    @abc.abstractmethod
    def units(self, values: Sequence[Any], texts: Sequence[str]) -> list[Unit]:
        """The conversation's units, from its elements' (clean) values and texts."""

    @abc.abstractmethod
    def identity(self, unit: Unit) -> str:
        """What the unit says, canonically: the same for the agent's resend of an answer the proxy recorded."""

    @abc.abstractmethod
    def parts(self, unit: Unit) -> list[dict[str, Any]]:
        """The unit as the sidecar's messages (OpenAI Chat messages, without ids), in order."""

    @abc.abstractmethod
    def render_unit(self, unit: Unit, items: Sequence[Item]) -> list[str]:
        """The elements (JSON texts) for those of a unit's parts that the context holds (``Item.id`` names the
        part): its original texts as they are when all of it is there unchanged."""

    @abc.abstractmethod
    def render_others(self, items: Sequence[Item]) -> list[str]:
        """The elements for summaries and for messages other clients stored, from the sidecar's messages."""

    def finish(self, elements: list[bytes], breakpoints: Sequence[int], marker: str | None) -> list[bytes]:
        """The whole conversation (its elements' UTF-8 JSON), last touches: cache markers after the ``breakpoints``
        (element indexes), in the agent's own ``marker`` JSON when it sent one."""
        return elements

    def marker(self, request: Request) -> tuple[int, str | None]:
        """How many cache markers the request's system prompt and tools hold, and the agent's message marker."""
        return 0, None

    @abc.abstractmethod
    def recorder(self, stream: bool) -> Recorder:
        """A recorder for the upstream's answer."""

    @abc.abstractmethod
    def error_body(self, status: int, message: str) -> bytes:
        """An error as the provider writes it."""


def sidecar_messages(adapter: Adapter, units: Sequence[Unit], ids: Sequence[str]) -> list[dict[str, Any]]:
    """The units as messages to ingest: ids per part, the unit's original on its first part."""
    out: list[dict[str, Any]] = []
    for unit, uid in zip(units, ids, strict=True):
        parts = adapter.parts(unit)
        for index, part in enumerate(parts):
            message = {**part, "id": part_id(uid, index, len(parts)),
                       "metadata": {"format": adapter.name, **(part.get("metadata") or {})}}
            if index == 0:
                message["original"] = list(unit.texts)
            out.append(message)
    return out
