"""How a summary appears in an assembled context, and what it costs there."""

from __future__ import annotations

import html
import json

from sidecar.engine.tokens import MESSAGE_OVERHEAD_TOKENS, estimate_text_tokens


def render_summary(summary_id: str, kind: str, depth: int, earliest_at: str | None, latest_at: str | None,
                   content: str) -> str:
    """A summary as the content of a user message; the text is escaped so it cannot close or forge the tag."""
    attributes = {"id": summary_id, "kind": kind, "depth": str(depth), "earliest_at": earliest_at or "",
                  "latest_at": latest_at or ""}
    tag = " ".join(f'{name}="{html.escape(value, quote=True)}"' for name, value in attributes.items())
    return (
        f"<summary {tag}>\n{html.escape(content, quote=False)}\n</summary>\n"
        f"This summarizes earlier messages. Their full detail is kept: open them with memory_expand (memory/expand) "
        f"id {json.dumps(summary_id)}, or search them with memory_grep or memory_query."
    )


def summary_message_tokens(summary_id: str, kind: str, depth: int, earliest_at: str | None,
                           latest_at: str | None, content: str) -> int:
    """Tokens of the rendered summary message, as it is counted in the context."""
    rendered = render_summary(summary_id, kind, depth, earliest_at, latest_at, content)
    return MESSAGE_OVERHEAD_TOKENS + estimate_text_tokens(rendered)
