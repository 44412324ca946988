"""Standing rules and pinned notes planted in the pi session, after a `full` compaction (issue 12)."""

from __future__ import annotations

import copy
import json
import random
from typing import Any

import bench.core as core
from bench.core import SETTINGS, Bench, merge, progress
from protocol.types import Message, SessionInfo
from sidecar.client import SidecarClient, SidecarRequestError
from sidecar.testing import FakeOpenAIServer, Reply

WINDOW = 32_000
"""The session's context window: `full` compaction then brings the 87k-token session under 23,808 tokens."""
RULES = (
    "Never push directly to the main branch of this repository.",
    "Always run the full test suite before you commit anything.",
    "Do not touch the files under vendor/ in any change.",
    "You must keep the public API of the tui package unchanged.",
    "Make sure every new function has a type annotation.",
    "Don't add new runtime dependencies without asking first.",
    "Never print the contents of the credentials file to the terminal.",
    "Always write commit messages in the imperative mood.",
    "Do not reformat code that you are not otherwise changing.",
    "You must ask before deleting any file from the docs folder.",
)
"""Standing rules, each appended to a user message of the session."""
NOTES = tuple(f"Pinned note {n}: release step {n} is described in docs/release-{n}.md and reviewed by owner-{n}."
              for n in range(1, 11))
"""Pinned notes, each a user message of its own, ingested with ``"pinned": true``."""
GENERIC_SUMMARY = (
    "## Progress\nThe agent worked through several rendering problems of the terminal interface, read the "
    "relevant modules, made edits and ran the tests.\n## Next\nContinue with the remaining open problems."
)
"""What the fake LLM answers to every summary request: it names none of the rules or notes."""
SESSION = "rules"


def planted(messages: list[Message], pinned: bool, seed: int = 12) -> tuple[list[Message], int, int]:
    """The session with rules appended to random user messages and notes before others: (messages, rules, notes)."""
    users = [index for index, message in enumerate(messages) if message.get("role") == "user"]
    rng = random.Random(seed)
    rule_at = dict(zip(sorted(rng.sample(users, min(len(RULES), len(users)))), RULES, strict=False))
    note_at = dict(zip(sorted(rng.sample(users, min(len(NOTES), len(users)))), NOTES, strict=False))
    out: list[Message] = []
    for index, message in enumerate(messages):
        if index in note_at:
            note: Message = {"role": "user", "content": note_at[index], "id": f"pinned-note-{len(out)}"}
            if pinned:
                note["pinned"] = True
            out.append(note)
        if index in rule_at:
            message = copy.deepcopy(message)
            content = message.get("content")
            if isinstance(content, list):
                message["content"] = [*content, {"type": "text", "text": rule_at[index]}]
            else:
                message["content"] = f"{content or ''}\n\n{rule_at[index]}"
        out.append(message)
    return out, len(rule_at), len(note_at)


async def pinned_support(client: SidecarClient) -> str | None:
    """None when the server keeps ``pinned`` on ingest (memory/describe shows it), else why not."""
    probe = {"role": "user", "content": "probe", "id": "pin-probe-1", "pinned": True}
    try:
        result = await client.ingest("pin-probe", [probe])
    except SidecarRequestError as error:
        return f"pinned unsupported: ingest answered {error.code}"
    described = await client.request("memory/describe", {"sessionId": "pin-probe", "id": result.ids[0]})
    return None if isinstance(described, dict) and described.get("pinned") is True else "pinned unsupported"


async def retained(bench: Bench, key: str, llm: dict[str, Any]) -> None:
    """A fresh server and DB: ingest the planted session, compact `full`, count what the assembled context keeps."""
    settings = copy.deepcopy(SETTINGS)
    merge(settings, {"compaction": {"auto": False, "maxTokens": 80_000}, "llm": llm})
    db = str(bench.workdir / f"retention-{key}.duckdb")
    async with await SidecarClient.spawn(db=db, settings=settings) as client:
        unsupported = await pinned_support(client)
        messages, rules, notes = planted(bench.pi_messages(), pinned=unsupported is None)
        for start in range(0, len(messages), bench.sizes.batch):
            info = SessionInfo(context_window=WINDOW) if start == 0 else None
            await client.ingest(SESSION, messages[start:start + bench.sizes.batch], session=info)
        result = await client.compact(SESSION, mode="full")
        assembled = await client.assemble(SESSION)
    text = json.dumps(assembled.messages, ensure_ascii=False)
    bench.info[f"retention_{key}_planted"] = {"rules": rules, "notes": notes}
    bench.info[f"retention_{key}_compaction"] = {"compacted": result.compacted, "reason": result.reason,
                                                 "tokensBefore": result.tokens_before,
                                                 "tokensAfter": result.tokens_after}
    what = "deterministic summarizer" if key == "det" else "LLM with a generic summary"
    kept_rules = sum(rule in text for rule in RULES[:rules])
    bench.record(f"retention_{key}_rules", f"rules verbatim after full compaction, {what}",
                 kept_rules / max(rules, 1), "share")
    label = f"  pinned notes verbatim after full compaction, {what}"
    if unsupported:
        bench.record_missing(f"retention_{key}_notes", label, "share", unsupported)
    else:
        bench.record(f"retention_{key}_notes", label, sum(note in text for note in NOTES[:notes]) / max(notes, 1),
                     "share")


async def rule_retention(bench: Bench) -> None:
    """Plant 10 rules and 10 pinned notes in the pi session, compact `full` (deterministic, then LLM): share kept."""
    if not core.PI_SESSION.exists():
        why = f"{core.PI_SESSION} not found"
        progress(f"rule retention skipped: {why}")
        for key in ("det", "llm"):
            for what in ("rules", "notes"):
                bench.record_missing(f"retention_{key}_{what}", f"{what} verbatim after full compaction ({key})",
                                     "share", why)
        return
    progress("rule retention: deterministic summarizer")
    await retained(bench, "det", {"model": None, "baseUrl": None})
    with FakeOpenAIServer() as fake:
        fake.responder = lambda request: Reply(text=GENERIC_SUMMARY)
        progress("rule retention: LLM (local OpenAI test server, generic summary)")
        await retained(bench, "llm", {"baseUrl": fake.base_url, "model": "fake-model"})
        bench.info["retention_llm_http_requests"] = len(fake.chat_requests)
