"""Command-line tools built on the Python client: transcript import and replay."""

from __future__ import annotations

import sys

from protocol.types import Usage

SERVER_COMMAND = [sys.executable, "-m", "sidecar"]


def usage_text(usage: Usage) -> str:
    """One usage figure as a person reads it."""
    hint = f" — {usage.hint}" if usage.hint else ""
    return (f"{usage.tokens:,} tokens of {usage.context_window:,} ({usage.percent:.1f}%), "
            f"state {usage.state}, {usage.source}{hint}")


def plural(count: int, word: str, many: str | None = None) -> str:
    """``1 message``, ``2 messages``."""
    return f"{count:,} {word if count == 1 else many or word + 's'}"


def say(text: str = "") -> None:
    """Print a line now (the output is often piped)."""
    print(text, flush=True)
