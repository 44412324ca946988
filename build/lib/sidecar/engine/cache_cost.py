"""Whether rewriting part of a prompt pays for itself at the provider's prompt-cache prices."""

from __future__ import annotations

ITEMS_PER_PROMPT = 2
"""Items an agent adds between two prompts (its reply and a tool result, or a user message and a reply): the growth
per prompt is this many average items until one was measured."""

GROWTH_SAMPLES = 50
"""Assembles the growth per prompt averages over: a plain mean of the first ones, then a moving average as long."""


def step_pays(saved: float, rewritten: float, headroom: float, growth: float, read_price: float,
              write_price: float) -> bool:
    """Whether a prune step pays back before the next compaction rewrites the prompt anyway.

    It saves ``saved`` tokens, read from the cache, on each prompt until the context has grown by ``headroom`` at
    ``growth`` tokens per prompt; it costs the ``rewritten`` tokens after its first pruned message, written to the
    cache once instead of read.
    """
    if write_price <= read_price:
        return True
    if headroom <= 0 or growth <= 0:
        return False
    prompts = headroom / growth
    return read_price * saved * prompts >= (write_price - read_price) * rewritten


def smoothed_growth(previous: float | None, samples: int, sample: float) -> float:
    """The growth per prompt after one more ``sample``, ``samples`` (this one included) in all."""
    if previous is None:
        return sample
    weight = 1 / min(samples, GROWTH_SAMPLES)
    return weight * sample + (1 - weight) * previous
