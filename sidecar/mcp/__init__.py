"""The MCP face: ``context-sidecar mcp``, an MCP server on stdio offering the memory tools to Claude Code, Codex, …

Our own small implementation of the MCP stdio subset (newline-delimited JSON-RPC 2.0) rather than the MCP SDK:
an agent in headless mode waits about a second for its MCP servers, and importing the SDK alone took two.
"""
