"""What the two OpenAI formats share: their error body and the reading of a usage object."""

from __future__ import annotations

from typing import Any

from sidecar.proxy.adapters.base import Recorded, Unit
from sidecar.proxy.jsontext import compact

ERROR_TYPES = {400: "invalid_request_error", 401: "invalid_request_error", 404: "invalid_request_error",
               429: "rate_limit_exceeded", 502: "server_error"}


def error_body(status: int, message: str) -> bytes:
    """An error as OpenAI writes it."""
    kind = ERROR_TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")
    return compact({"error": {"message": message, "type": kind, "param": None, "code": None}}).encode()


def recorded(unit: Unit | None, usage: Any) -> Recorded:
    """An answer with OpenAI's usage (``input_tokens``/``prompt_tokens`` count cached tokens too)."""
    if not isinstance(usage, dict):
        return Recorded(unit)
    prompt = usage.get("input_tokens", usage.get("prompt_tokens"))
    output = usage.get("output_tokens", usage.get("completion_tokens"))
    details = usage.get("input_tokens_details") or usage.get("prompt_tokens_details") or {}
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    cached = cached if isinstance(cached, int) else 0
    if not isinstance(prompt, int) or not isinstance(output, int):
        return Recorded(unit)
    return Recorded(unit, prompt - cached, output, cached, 0)


def content_text(content: Any) -> str:
    """The text of a message's content: a string, or parts with ``text``."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return ""
    return "\n".join(part["text"] for part in content
                     if isinstance(part, dict) and isinstance(part.get("text"), str))
