"""Generated coding-agent sessions: about 1 KB per message, tool calls with their results."""

from __future__ import annotations

import itertools
import json
import random
from collections.abc import Iterator
from typing import Any

Message = dict[str, Any]
NEEDLE = "ECONNRESET"
"""Planted in every 997th tool output, for memory/grep."""

WORDS = [
    "the", "a", "to", "of", "and", "in", "is", "it", "for", "that", "this", "with", "test", "fix", "error",
    "file", "function", "value", "return", "request", "handler", "token", "session", "cache", "retry",
    "config", "parse", "module", "import", "update", "check", "path", "user", "query", "result", "timeout",
    "async", "await", "list", "dict", "missing", "failing", "expected", "actual", "line", "call", "raise",
    "index", "build"
]
IDENTS = [
    "user_id", "session", "token", "retries", "payload", "cursor", "rows", "config", "cache_key",
    "deadline", "response", "parser", "handler", "backoff", "limit", "offset", "items", "result", "buffer",
    "stream"
]
FILES = ["src/app.py", "src/db/models.py", "src/api/routes.py", "tests/test_api.py", "src/utils/retry.py",
         "src/cli.py", "src/auth/tokens.py", "src/db/migrations/0007_rename.py", "docs/setup.md"]
TOOLS = ["read", "grep", "edit", "bash"]


def _sentence(rng: random.Random) -> str:
    return " ".join(rng.choices(WORDS, k=rng.randint(6, 14))).capitalize() + "."


def _code_line(rng: random.Random) -> str:
    a, b = rng.sample(IDENTS, 2)
    return rng.choice([
        f"def {a}_{b}(self, {a}: int = {rng.randint(0, 999)}) -> dict[str, Any]:",
        f"    {a} = self.{b}.get({a!r}, {rng.randint(0, 99)})  # {_sentence(rng)}",
        f"    if {a} is None or {b} > {rng.randint(1, 64)}:",
        f"        raise ValueError(f\"{_sentence(rng)} {{{a}}}\")",
    ])


_POOL = random.Random(0)
SENTENCES = [_sentence(_POOL) for _ in range(4000)]
CODE_LINES = [_code_line(_POOL) for _ in range(4000)]


def prose(rng: random.Random, words: int) -> str:
    """Plausible agent prose of about ``words`` words."""
    # Pooled sentences: generating a million messages must take seconds, not minutes.
    return " ".join(rng.choices(SENTENCES, k=max(1, words // 10)))


def code(rng: random.Random, lines: int) -> str:
    """Plausible Python source, as a read tool returns it."""
    start = rng.randint(1, 400)
    return "\n".join(f"{start + n:4d}  {line}" for n, line in enumerate(rng.choices(CODE_LINES, k=lines)))


def conversation(prefix: str, seed: int) -> Iterator[Message]:
    """An endless coding-agent session with client ids ``<prefix>-N``."""
    rng = random.Random(seed)
    counter = itertools.count(1)
    tool_outputs = 0
    system = "You are a careful coding agent. " + prose(rng, 60)
    yield {"id": f"{prefix}-0", "role": "system", "content": system}
    while True:
        yield {"id": f"{prefix}-{next(counter)}", "role": "user", "content": prose(rng, rng.randint(30, 70))}
        for _ in range(rng.randint(1, 3)):
            calls = []
            for _ in range(rng.randint(1, 2)):
                tool, path = rng.choice(TOOLS), rng.choice(FILES)
                arguments = {"path": path, **({"pattern": rng.choice(IDENTS)} if tool == "grep" else {})}
                calls.append({"id": f"call_{prefix}_{next(counter)}", "type": "function",
                              "function": {"name": tool, "arguments": json.dumps(arguments)}})
            yield {"id": f"{prefix}-{next(counter)}", "role": "assistant",
                   "content": prose(rng, rng.randint(15, 40)), "tool_calls": calls}
            for call in calls:
                tool_outputs += 1
                text = code(rng, rng.randint(12, 24))
                if tool_outputs % 997 == 0:
                    text += f"\nrequests.exceptions.ConnectionError: [Errno 104] {NEEDLE}"
                yield {"id": f"{prefix}-{next(counter)}", "role": "tool", "tool_call_id": call["id"],
                       "content": text}
        yield {"id": f"{prefix}-{next(counter)}", "role": "assistant",
               "content": prose(rng, rng.randint(80, 200))}
