"""The proxy face: an HTTP server between a coding agent and its provider that assembles every prompt.

The agent (Claude Code, Codex, anything speaking the Anthropic Messages, OpenAI Responses or Chat Completions
API) resends its whole conversation on every request; the proxy stores what is new through the shared host, asks
it for the assembled context, renders that in the provider's format from the stored originals, forwards it, and
streams the answer back unchanged while recording it. ``adapters/`` holds one module per wire format; the rest
(sessions and branches, ingest, assembly, stats, HTTP) is format-neutral. See docs/proxy.md.
"""
