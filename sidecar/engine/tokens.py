"""The one token estimator used everywhere: about 4 UTF-8 bytes per token.

Estimates are computed once per stored row and cached in the database; a
session's calibration factor (provider-reported over estimated) scales them
at read time, so the raw estimate never needs recomputing.
"""

from __future__ import annotations

import json
from typing import Any

BYTES_PER_TOKEN = 4
MESSAGE_OVERHEAD_TOKENS = 4
"""Role, separators and framing the chat template adds around every message."""


def estimate_text_tokens(text: str) -> int:
    """Tokens of a text: its UTF-8 byte length over four, rounded up."""
    if not text:
        return 0
    size = len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))  # isascii() copies nothing
    return -(-size // BYTES_PER_TOKEN)


def estimate_bytes_tokens(size: int) -> int:
    """Tokens of ``size`` bytes of UTF-8 text (or JSON): over four, rounded up."""
    return -(-size // BYTES_PER_TOKEN)


def estimate_message_tokens(message: dict[str, Any], max_tokens_per_part: int) -> int:
    """Tokens of one chat message: overhead plus each part, each part capped."""
    total = MESSAGE_OVERHEAD_TOKENS
    content = message.get("content")
    if isinstance(content, str):
        total += min(estimate_text_tokens(content), max_tokens_per_part)
    elif isinstance(content, list):
        for part in content:
            total += min(_part_tokens(part), max_tokens_per_part)
    name = message.get("name")
    if isinstance(name, str):
        total += estimate_text_tokens(name)
    for call in message.get("tool_calls") or ():
        function = (call.get("function") or {}) if isinstance(call, dict) else {}
        if not isinstance(function, dict):
            function = {}
        text = f"{function.get('name', '')}{function.get('arguments', '')}"
        total += min(estimate_text_tokens(text), max_tokens_per_part) + MESSAGE_OVERHEAD_TOKENS
    return total


def _part_tokens(part: Any) -> int:
    """Tokens of one content part: its text, or its JSON for non-text parts."""
    if isinstance(part, dict) and isinstance(part.get("text"), str):
        return estimate_text_tokens(part["text"])
    if isinstance(part, dict) and part.get("type") == "image_url":
        return 765  # OpenAI's figure for one high-detail 512px tile set; images are not bytes of text
    return estimate_text_tokens(json.dumps(part, ensure_ascii=False, separators=(",", ":")))
