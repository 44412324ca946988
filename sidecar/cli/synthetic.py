"""Generated coding-agent sessions, for the demo, tests and benchmarks: realistic shape, no network."""

from __future__ import annotations

import json
import random
from typing import Any

FILES = ["src/app.py", "src/db/models.py", "src/api/routes.py", "tests/test_api.py", "README.md",
         "src/utils/retry.py", "pyproject.toml", "src/cli.py", "docs/setup.md", "src/auth/tokens.py"]
TASKS = [
    "The login endpoint returns 500 when the token has expired; make it return 401 with a clear message.",
    "Add retry with exponential back-off to the HTTP client in src/utils/retry.py, at most 5 attempts.",
    "Rename the `User.fullname` field to `display_name` everywhere, including the migrations.",
    "Write tests for the pagination of /api/items; the last page is currently empty.",
    "Speed up the report query: it scans the whole events table for one customer.",
]
RULES = [
    "Never commit secrets; the API key lives in the OPENAI_API_KEY environment variable.",
    "Always run `pytest -q` before saying a change is done.",
    "Use type hints everywhere and keep functions under 40 lines.",
]
CODE = '''def handler(request):
    token = request.headers.get("Authorization", "")
    user = verify(token)
    if user is None:
        raise Unauthorized("token expired or invalid")
    return render(user, request.args)
'''


def coding_session(messages: int, seed: int = 7, tool_output_bytes: int = 1200) -> list[dict[str, Any]]:
    """A coding-agent session of about ``messages`` OpenAI messages, with tool calls and results."""
    rng = random.Random(seed)
    out: list[dict[str, Any]] = [{"role": "system", "content": "You are a careful coding agent. "
                                  + " ".join(RULES), "id": "sys-0"}]
    turn = 0
    while len(out) < messages:
        turn += 1
        task = TASKS[(turn - 1) % len(TASKS)]
        out.append({"role": "user", "id": f"u{turn}", "content": f"{task} {rng.choice(RULES)}"})
        for step in range(rng.randint(1, 4)):
            path = rng.choice(FILES)
            tool = rng.choice(["read", "grep", "edit", "bash"])
            call_id = f"call_{turn}_{step}"
            arguments = {"read": {"path": path}, "grep": {"pattern": "def ", "path": path},
                         "edit": {"path": path, "old": "fullname", "new": "display_name"},
                         "bash": {"command": "pytest -q tests/test_api.py"}}[tool]
            out.append({"role": "assistant", "id": f"a{turn}_{step}",
                        "content": f"Let me {tool} {path} to check how it handles this.",
                        "tool_calls": [{"id": call_id, "type": "function",
                                        "function": {"name": tool, "arguments": json.dumps(arguments)}}]})
            out.append({"role": "tool", "id": f"t{turn}_{step}", "tool_call_id": call_id,
                        "content": _tool_output(tool, path, rng, tool_output_bytes)})
        out.append({"role": "assistant", "id": f"a{turn}_done",
                    "content": f"Done with turn {turn}: I decided to change {rng.choice(FILES)} "
                               f"because the old code ignored expired tokens. Tests pass (12 passed)."})
    return out[:messages]


def _tool_output(tool: str, path: str, rng: random.Random, size: int) -> str:
    if tool == "bash":
        failed = rng.random() < 0.3
        body = "FAILED tests/test_api.py::test_expired - AssertionError: 500 != 401\n" if failed else ""
        return f"{body}{12 - failed} passed, {int(failed)} failed in 0.{rng.randint(10, 99)}s"
    text = f"# {path}\n" + CODE * (size // len(CODE) + 1)
    return text[:size]
