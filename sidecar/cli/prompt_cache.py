"""A provider's prompt cache as the replay and the bench model it: prefix reuse between prompts, and its price.

The model (Anthropic's billing, which OpenAI and others approximate): each prompt is compared with the
previous prompt of the same session, message by message, as the JSON bytes a client would forward. The
longest run of leading messages that are byte-identical is billed at the cache-read price; every other
token of the prompt at the cache-write price (the client marks the end of each prompt for caching, so the
new tail is written for the next call). The first prompt is all cache write. Not modelled: the cache's
time to live (prompts are assumed minutes apart at most), minimum cacheable lengths, prefixes of
prompts older than the previous one, and output tokens. The ``input`` price (no caching at all) prices
the same prompts uncached, as a reference.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Sequence
from typing import Any

from sidecar.config.defaults import CACHE_READ_PRICE, CACHE_WRITE_PRICE

PRICE_NAMES = ("read", "write", "input")


@dataclasses.dataclass(frozen=True)
class Prices:
    """Price per prompt token, relative to one uncached input token."""

    read: float = CACHE_READ_PRICE
    """A token of the repeated prefix (a cache read)."""
    write: float = CACHE_WRITE_PRICE
    """A token after the repeated prefix (a cache write)."""
    input: float = 1.0
    """A token sent with no caching at all: the reference cost."""

    def text(self) -> str:
        """``read=0.1,write=1.25,input=1``, as ``--prices`` takes it."""
        return ",".join(f"{name}={getattr(self, name):g}" for name in PRICE_NAMES)


def parse_prices(text: str) -> Prices:
    """Prices from ``read=0.1,write=1.25,input=1.0`` (any subset, the rest default); ValueError says what is wrong."""
    values: dict[str, float] = {}
    for part in text.split(","):
        name, equals, raw = (piece.strip() for piece in part.partition("="))
        if not equals or not name:
            raise ValueError(f"expected NAME=PRICE pairs separated by commas ({', '.join(PRICE_NAMES)}), got {part!r}")
        if name not in PRICE_NAMES:
            raise ValueError(f"unknown price {name!r}; the prices are {', '.join(PRICE_NAMES)}")
        if name in values:
            raise ValueError(f"price {name!r} given twice")
        try:
            value = float(raw)
        except ValueError:
            raise ValueError(f"price {name}={raw!r} is not a number") from None
        if not math.isfinite(value) or value < 0:
            raise ValueError(f"price {name}={raw} must be a finite number ≥ 0")
        values[name] = value
    return Prices(**values)


def message_bytes(message: Any) -> bytes:
    """A message as the compact UTF-8 JSON a client forwards (keys in the order received)."""
    return json.dumps(message, ensure_ascii=False, separators=(",", ":")).encode()


def shared_prefix(previous: Sequence[bytes], current: Sequence[bytes]) -> int:
    """How many leading messages of ``current`` are byte-identical to ``previous``'s."""
    count = 0
    for old, new in zip(previous, current, strict=False):
        if old != new:
            break
        count += 1
    return count


@dataclasses.dataclass(frozen=True)
class PromptCost:
    """One prompt as the cache sees it."""

    tokens: int
    repeated: int
    """Tokens of the leading messages byte-identical to the previous prompt's (cache read)."""
    kept: int
    """How many leading messages those are."""
    previous_tokens: int
    cost: float

    @property
    def share(self) -> float:
        """Repeated tokens over this prompt's tokens."""
        return self.repeated / self.tokens if self.tokens else 0.0


@dataclasses.dataclass
class PromptCache:
    """The consecutive prompts of one session, priced as the module docstring says."""

    prices: Prices = dataclasses.field(default_factory=Prices)
    prompts: int = 0
    tokens: int = 0
    repeated: int = 0
    cost: float = 0.0
    short: int = 0
    """Prompts after the first that repeat less than half of the previous prompt's tokens."""
    previous: list[bytes] = dataclasses.field(default_factory=list)
    previous_tokens: int = 0

    def send(self, messages: Sequence[Any], tokens: Sequence[int]) -> PromptCost:
        """Count one prompt: its messages and each message's tokens."""
        if len(messages) != len(tokens):
            raise ValueError(f"{len(messages)} messages but {len(tokens)} token counts")
        current = [message_bytes(message) for message in messages]
        kept = shared_prefix(self.previous, current)
        total = sum(tokens)
        repeated = sum(tokens[:kept])
        cost = repeated * self.prices.read + (total - repeated) * self.prices.write
        step = PromptCost(total, repeated, kept, self.previous_tokens, cost)
        if self.prompts and repeated < self.previous_tokens / 2:
            self.short += 1
        self.prompts += 1
        self.tokens += total
        self.repeated += repeated
        self.cost += cost
        self.previous, self.previous_tokens = current, total
        return step

    @property
    def hit_rate(self) -> float:
        """Prompt tokens that repeat the previous prompt's prefix over all prompt tokens."""
        return self.repeated / self.tokens if self.tokens else 0.0

    @property
    def uncached_cost(self) -> float:
        """The same prompts at the input price, with no cache."""
        return self.tokens * self.prices.input
