"""Live agent transcripts written as the agents write them (Claude Code 2.1's entries), for tests and benchmarks.

The shapes follow Claude Code 2.1.197's files: one entry per content block of a streamed response (each with the
response's usage), tool results as user entries chained to their ``tool_use`` entry, a ``compact_boundary``
system entry and an ``isCompactSummary`` user entry after ``/compact``, ``queue-operation`` and ``last-prompt``
bookkeeping between turns.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

CLAUDE_VERSION = "2.1.197"
MODEL = "claude-sonnet-4-5-20250929"
FILES = ("src/app.py", "src/db/models.py", "src/api/routes.py", "tests/test_api.py", "src/auth/tokens.py")
TASKS = ("The login endpoint returns 500 when the token has expired; make it return 401.",
         "Add retry with exponential back-off to the HTTP client, at most 5 attempts.",
         "Write tests for the pagination of /api/items; the last page is currently empty.")
CODE = 'def handler(request):\n    token = request.headers.get("Authorization", "")\n    return verify(token)\n'
COMPACT_PREFACE = ("This session is being continued from a previous conversation that ran out of context. "
                   "The summary below covers the earlier portion of the conversation.\n\n")
COMPACT_TRAILER = ("\n\nIf you need specific details from before compaction (like exact code snippets, error messages, "
                   "or content you generated), read the full transcript at: {path}\nContinue the conversation from "
                   "where it left off without asking the user any further questions.")


@dataclass
class ClaudeCodeWriter:
    """Appends Claude Code entries to a project transcript, as Claude Code does while a session runs."""

    path: Path
    cwd: str
    session_id: str = field(default_factory=lambda: str(uuid.uuid4()))
    parent: str | None = None
    """The uuid of the last entry on the conversation chain."""
    clock: datetime = field(default_factory=lambda: datetime(2026, 11, 20, 9, 0, tzinfo=UTC))
    responses: int = 0
    prompt_tokens: int = 9_000
    """What the provider counts as the prompt of the next call (grows with the session)."""

    def _stamp(self) -> str:
        self.clock += timedelta(seconds=2)
        return self.clock.isoformat(timespec="milliseconds").replace("+00:00", "Z")

    def _envelope(self, kind: str, **fields: Any) -> dict[str, Any]:
        entry_id = str(uuid.uuid4())
        entry = {"parentUuid": self.parent, "isSidechain": False, "userType": "external", "cwd": self.cwd,
                 "sessionId": self.session_id, "version": CLAUDE_VERSION, "gitBranch": "main", "type": kind,
                 **fields, "uuid": entry_id, "timestamp": self._stamp()}
        self.parent = entry_id
        return entry

    def write(self, *entries: dict[str, Any]) -> None:
        """Append entries, one JSON line each, in one write."""
        with self.path.open("a", encoding="utf-8") as fh:
            fh.write("".join(json.dumps(entry, ensure_ascii=False) + "\n" for entry in entries))

    def user(self, text: str) -> dict[str, Any]:
        """A prompt the user typed, with the queue bookkeeping Claude Code writes before it."""
        queue = {"type": "queue-operation", "operation": "enqueue", "timestamp": self._stamp(),
                 "sessionId": self.session_id, "content": text}
        entry = self._envelope("user", message={"role": "user", "content": text}, permissionMode="default")
        self.write(queue, entry)
        return entry

    def _usage(self, output: int) -> dict[str, Any]:
        return {"input_tokens": 4, "cache_creation_input_tokens": 600, "cache_read_input_tokens":
                max(0, self.prompt_tokens - 604), "output_tokens": output, "service_tier": "standard"}

    def assistant(self, text: str, tool: tuple[str, str, dict[str, Any]] | None = None,
                  thinking: str | None = None) -> list[dict[str, Any]]:
        """One response: its thinking, text and tool_use blocks as chained entries sharing its id and usage."""
        self.responses += 1
        message_id = f"msg_01{self.responses:022d}"
        blocks: list[dict[str, Any]] = []
        if thinking:
            blocks.append({"type": "thinking", "thinking": thinking, "signature": "c2lnbmF0dXJl"})
        blocks.append({"type": "text", "text": text})
        if tool is not None:
            call_id, name, arguments = tool
            blocks.append({"type": "tool_use", "id": call_id, "name": name, "input": arguments})
        usage = self._usage(max(1, len(text) // 4))
        stop = "tool_use" if tool is not None else "end_turn"
        entries = [self._envelope("assistant", requestId=f"req_{message_id}", message={
            "id": message_id, "type": "message", "role": "assistant", "model": MODEL, "content": [block],
            "stop_reason": stop if index == len(blocks) - 1 else None, "stop_sequence": None, "usage": usage})
            for index, block in enumerate(blocks)]
        self.write(*entries)
        self.prompt_tokens += len(text) // 4 + 20
        return entries

    def tool_result(self, call_id: str, output: str, is_error: bool = False) -> dict[str, Any]:
        """The result of a tool call, as the user entry Claude Code writes after running it."""
        block = {"type": "tool_result", "tool_use_id": call_id, "content": output, "is_error": is_error}
        entry = self._envelope("user", message={"role": "user", "content": [block]},
                               toolUseResult={"stdout": output, "stderr": "", "interrupted": False})
        self.write(entry)
        self.prompt_tokens += len(output) // 4 + 10
        return entry

    def end_turn(self) -> None:
        """The bookkeeping line Claude Code writes when a turn ends."""
        self.write({"type": "last-prompt", "leafUuid": self.parent, "sessionId": self.session_id})

    def compact(self, summary: str, trigger: str = "manual") -> tuple[dict[str, Any], dict[str, Any]]:
        """``/compact``: the boundary (a fresh root, linked back logically) and the summary Claude Code goes on from."""
        before = self.parent
        self.parent = None
        boundary = self._envelope("system", subtype="compact_boundary", content="Conversation compacted",
                                  isMeta=False, level="info", logicalParentUuid=before,
                                  compactMetadata={"trigger": trigger, "preTokens": self.prompt_tokens})
        text = COMPACT_PREFACE + summary + COMPACT_TRAILER.format(path=self.path)
        entry = self._envelope("user", message={"role": "user", "content": text}, isVisibleInTranscriptOnly=True,
                               isCompactSummary=True)
        self.write(boundary, entry)
        self.prompt_tokens = 1_500 + len(summary) // 4
        return boundary, entry

    def turn(self, index: int, output_bytes: int = 2_000) -> None:
        """One generated coding turn: a prompt, a tool call and its (sizable) output, an answer."""
        task = TASKS[index % len(TASKS)]
        name = FILES[index % len(FILES)]
        self.user(f"Turn {index}: {task}")
        call = f"toolu_01{index:022d}"
        self.assistant(f"Let me read {name} first.", (call, "Read", {"file_path": f"{self.cwd}/{name}"}),
                       thinking=f"The task is about {name}; read it before changing anything.")
        body = (CODE * (output_bytes // len(CODE) + 1))[:output_bytes]
        self.tool_result(call, f"     1\t# {name}\n{body}")
        self.assistant(f"Done with turn {index}: changed {name} so that the case is handled.")
        self.end_turn()

    def grow_to(self, size: int, output_bytes: int = 2_000) -> int:
        """Write generated turns until the file holds at least ``size`` bytes; returns the turns written."""
        turns = 0
        while not self.path.exists() or self.path.stat().st_size < size:
            self.turn(turns, output_bytes)
            turns += 1
        return turns

