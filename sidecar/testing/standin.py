"""A stand-in model on an OpenAI-compatible endpoint, so that an agent example runs with no key and no network.

    python -m sidecar.testing.standin            # serves http://127.0.0.1:8321/v1 until Ctrl-C

Offered the sidecar's memory tools after a user message, it calls ``memory_grep`` for the longest word of that
message; after a tool result, it answers with the result's first match. Anything else (a summarizer's request)
gets a short fixed summary. Not a model: a predictable counterpart for examples and first tries.
"""

from __future__ import annotations

import argparse
import itertools
import json
import re
from collections.abc import Sequence

from sidecar.testing.conversation import text_of
from sidecar.testing.openai_server import FakeOpenAIServer, RecordedRequest, Reply
from sidecar.testing.serving import serve_until_signalled

DEFAULT_PORT = 8321
SUMMARY = "The stand-in model does not summarize; this text stands for the older messages."
_calls = itertools.count(1)


def _first_match(result: str) -> str:
    """The first match of a ``memory_grep`` result (its heading and snippet), else the result's first line."""
    lines = [line.strip() for line in result.splitlines() if line.strip()]
    for index, line in enumerate(lines):
        heading = re.match(r"\d+\. (\w+ \S+)", line)
        if heading and index + 1 < len(lines):
            return f"{lines[index + 1]} ({heading.group(1)})"
    return lines[0] if lines else "(nothing)"


def respond(request: RecordedRequest) -> Reply:
    """The stand-in's answer to one chat completion request."""
    body = request.body if isinstance(request.body, dict) else {}
    messages = body.get("messages") or [{}]
    last = messages[-1] if isinstance(messages[-1], dict) else {}
    if last.get("role") == "user" and "memory_grep" in {tool.name for tool in request.tools}:
        words = re.findall(r"[A-Za-z_]{3,}", text_of(last.get("content")))
        if words:
            pattern = max(words, key=len)
            return Reply(text="", tool_calls=((f"call_standin_{next(_calls)}", "memory_grep",
                                               json.dumps({"pattern": pattern})),))
    if last.get("role") == "tool":
        return Reply(text=f"From memory: {_first_match(text_of(last.get('content')))}")
    return Reply(text=SUMMARY)


def main(argv: Sequence[str] | None = None) -> int:
    """Serve the stand-in model until interrupted."""
    parser = argparse.ArgumentParser(prog="python -m sidecar.testing.standin", description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"port on 127.0.0.1 (default {DEFAULT_PORT})")
    args = parser.parse_args(argv)
    try:
        server = FakeOpenAIServer(responder=respond, port=args.port, models=("standin",)).start()
    except OSError as error:
        parser.exit(1, f"cannot listen on 127.0.0.1:{args.port}: {error.strerror}\n")
    return serve_until_signalled(f"a stand-in model on {server.base_url} (Ctrl-C stops it)", server.stop)


if __name__ == "__main__":
    raise SystemExit(main())
