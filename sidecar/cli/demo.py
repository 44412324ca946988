"""``context-sidecar demo``: a generated coding session through the real server, shown as a user would want."""

from __future__ import annotations

import asyncio
import textwrap
from datetime import UTC, datetime
from typing import Any

from protocol.types import CompactResult, Usage
from sidecar.cli import plural, report_error, spawn_server
from sidecar.cli.synthetic import coding_session
from sidecar.client import SidecarClient, SidecarRequestError

BUDGET = 6000


def run_demo(db: str | None, messages: int) -> int:
    """Run the demo; returns the exit code."""
    try:
        return asyncio.run(_demo(db, messages))
    except SidecarRequestError as error:
        return report_error("demo", error)


def _line(text: str = "") -> None:
    print(text, flush=True)


def _usage(usage: Usage) -> str:
    hint = f" — {usage.hint}" if usage.hint else ""
    return (f"{usage.tokens:,} tokens of {usage.context_window:,} ({usage.percent:.1f}%), "
            f"state {usage.state}{hint}")


def _preview(message: dict[str, Any], width: int = 96) -> str:
    content = message.get("content")
    if isinstance(content, list):
        content = " ".join(part.get("text", f"[{part.get('type')}]") for part in content)
    if not content and message.get("tool_calls"):
        content = ", ".join(f"{c['function']['name']}({c['function']['arguments']})" for c in message["tool_calls"])
    text = " ".join(str(content or "").split())
    return textwrap.shorten(f"{message['role']:>9}: {text}", width=width, placeholder=" …")


async def _demo(db: str | None, count: int) -> int:
    session_id = "demo-" + datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
    settings: dict[str, Any] = {"contextWindow": 32000, "compaction": {"auto": False}}
    async with await spawn_server(db, settings) as client:
        caps = client.capabilities
        _line(f"context-sidecar demo: a real sidecar over stdio (pid {client.process.pid if client.process else '?'})")
        _line(f"  storage: {caps.get('storage')}   summarizer: {caps.get('summarizer')} (no network, no API key)")
        _line()

        session = coding_session(count)
        result = await client.ingest(session_id, session, session={"title": "Demo: fix token expiry"})
        _line(f"1. Stored {plural(len(result.ids), 'message')} of a generated coding-agent session as {session_id!r}")
        _line(f"   usage: {_usage(result.usage)}")
        _line()

        assembled = await client.assemble(session_id, budget=BUDGET, fresh_tail=8)
        pruned = sum(1 for item in assembled.items if item.pruned)
        _line(f"2. Assembled the next LLM call within a {BUDGET:,}-token budget: "
              f"{plural(len(assembled.messages), 'message')}, "
              f"{assembled.tokens:,} tokens; {assembled.dropped} older items left out, {pruned} tool outputs pruned")
        for message in assembled.messages[-4:]:
            _line(f"   {_preview(message)}")
        _line()

        hits = await client.grep(session_id, "expired", limit=3)
        _line(f"3. memory/grep 'expired': {len(hits.matches)} shown{' (more exist)' if hits.truncated else ''}")
        for match in hits.matches:
            _line(f"   {match.id}: {textwrap.shorten(match.snippet, 88, placeholder=' …')}")
        _line()

        compacted = await client.compact(session_id, mode="incremental")
        if not compacted.compacted:
            _line(f"4. context/compact (incremental, {caps.get('summarizer')} summarizer): "
                  f"{compacted.reason}")
            _line()
        else:
            await _show_compaction(client, session_id, compacted, assembled.dropped, str(caps.get("summarizer")))

        listed = await client.sessions()
        _line(f"5. Sessions in this database: {len(listed.sessions)} "
              f"(the newest: {listed.sessions[0].session_id}, {plural(listed.sessions[0].messages, 'message')})")
    _line()
    _line(f"Done. The session stays in {caps.get('storage')}; run `context-sidecar demo` again to add another.")
    return 0


async def _show_compaction(client: SidecarClient, session_id: str, compacted: CompactResult, dropped_before: int,
                           summarizer: str) -> None:
    """Step 4 when the compaction replaced something: before and after, and the top summary opened."""
    after = await client.assemble(session_id, budget=BUDGET, fresh_tail=8)
    summaries = len(compacted.summary_ids)
    stands = "1 summary now stands" if summaries == 1 else f"{summaries} summaries now stand"
    _line(f"4. context/compact (incremental, {summarizer} summarizer): {compacted.tokens_before:,} -> "
          f"{compacted.tokens_after:,} tokens in {plural(compacted.rounds, 'round')}; {stands} for the old history")
    _line(f"   the same {BUDGET:,}-token budget now holds {len(after.messages)} messages, "
          f"{after.dropped} older items left out (before: {dropped_before})")
    for message in after.messages[:1]:
        _line(f"   {_preview(message, width=140)}")
    top = compacted.summary_ids[0]
    described = await client.describe(session_id, top)
    expanded = await client.expand(session_id, top)
    _line(f"   memory/expand {top}: a {described.kind} summary of depth {described.depth} over "
          f"{plural(described.message_count, 'message')}, with {plural(len(described.children), 'direct source')}; "
          f"the first {len(expanded.items)} within the default 4,000-token cap:")
    for item in expanded.items[:3]:
        _line(f"     {item.kind} {item.id}: {item.tokens:,} tokens")
    _line()
