"""The memory tools as MCP tools: the definitions ``memory/callTool`` runs, in MCP's shape for a protocol version."""

from __future__ import annotations

from typing import Any

from sidecar.services.model_tools import definitions as d

VERSIONS = ("2025-11-25", "2025-06-18", "2025-03-26", "2024-11-05")
"""MCP protocol versions this server speaks, newest first."""
LATEST = VERSIONS[0]
ANNOTATED_SINCE = "2025-03-26"
"""Tool annotations (readOnlyHint, title) exist from this version on."""
TITLES = {d.GREP: "Search memory", d.DESCRIBE: "Describe a summary", d.EXPAND: "Expand a summary or message",
          d.QUERY: "Ask memory a question"}
NAMES = frozenset(d.NAMES)


def negotiate(requested: str) -> str:
    """The version to speak: the client's when this server knows it, else the newest (the client then decides)."""
    return requested if requested in VERSIONS else LATEST


def mcp_tools(version: str) -> list[dict[str, Any]]:
    """``tools/list``'s tools: name, description and inputSchema (the function parameters) of each definition.

    Every memory tool only reads, so from 2025-03-26 on each is annotated ``readOnlyHint``: Codex runs an
    unannotated MCP tool only after an approval, which ``codex exec`` with ``approval_policy = "never"`` refuses.
    """
    tools = []
    for definition in d.definitions():
        function = definition["function"]
        tool: dict[str, Any] = {"name": function["name"], "description": function["description"],
                                "inputSchema": function["parameters"]}
        if version >= ANNOTATED_SINCE:  # ISO dates compare as strings
            tool["annotations"] = {"title": TITLES[function["name"]], "readOnlyHint": True, "destructiveHint": False,
                                   "idempotentHint": True, "openWorldHint": False}
        tools.append(tool)
    return tools
