"""A stand-in stdio MCP server (newline-delimited JSON-RPC, standard library) with one tool, ``memory_grep``.

Its answer names the pattern it was given, so a test can tell the agent called it with the model's arguments.
``STAND_IN_LOG=FILE`` appends each method it receives to FILE.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

TOOL = {"name": "memory_grep", "description": "Search stored memory for a pattern.",
        "inputSchema": {"type": "object", "properties": {"pattern": {"type": "string"}}, "required": ["pattern"]}}


def answer(message: dict[str, Any]) -> dict[str, Any] | None:
    """The reply to one message, or None for a notification."""
    method, ident, params = message.get("method"), message.get("id"), message.get("params") or {}
    if ident is None:
        return None
    if method == "initialize":
        result: dict[str, Any] = {"protocolVersion": params.get("protocolVersion", "2025-06-18"),
                                  "capabilities": {"tools": {}}, "serverInfo": {"name": "stand-in", "version": "1"}}
    elif method == "tools/list":
        result = {"tools": [TOOL]}
    elif method == "tools/call":
        pattern = (params.get("arguments") or {}).get("pattern", "")
        result = {"content": [{"type": "text", "text": f"MEMHIT stand-in matched {pattern!r}"}]}
    elif method == "ping":
        result = {}
    else:
        return {"jsonrpc": "2.0", "id": ident, "error": {"code": -32601, "message": f"no method {method}"}}
    return {"jsonrpc": "2.0", "id": ident, "result": result}


def main() -> None:
    """Serve stdin until it closes."""
    log = os.environ.get("STAND_IN_LOG")
    for line in sys.stdin:
        try:
            message = json.loads(line)
        except ValueError:
            continue
        if log:
            with open(log, "a", encoding="utf-8") as file:
                file.write(f"{message.get('method')}\n")
        reply = answer(message)
        if reply is not None:
            sys.stdout.write(json.dumps(reply) + "\n")
            sys.stdout.flush()


if __name__ == "__main__":
    main()
