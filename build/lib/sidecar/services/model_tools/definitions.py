"""The memory tools' OpenAI function-calling definitions: constants, serialised once, so byte-stable."""

from __future__ import annotations

import json
from typing import Any

GREP = "memory_grep"
DESCRIBE = "memory_describe"
EXPAND = "memory_expand"
QUERY = "memory_query"
NAMES = (GREP, DESCRIBE, EXPAND, QUERY)

GREP_DEFAULT_LIMIT = 10
GREP_MAX_LIMIT = 50
PATTERN_MAX_CHARS = 500
EXPAND_DEFAULT_TOKEN_CAP = 4000
EXPAND_MAX_TOKEN_CAP = 32000
"""Above this a tool result would crowd out the rest of a context: the model is told to ask for less."""
QUESTION_MAX_CHARS = 2000
ID_MAX_CHARS = 512


def _function(name: str, description: str, properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    return {"type": "function", "function": {
        "name": name, "description": description,
        "parameters": {"type": "object", "properties": properties, "required": required,
                       "additionalProperties": False}}}


_ID = {"type": "string", "minLength": 1, "maxLength": ID_MAX_CHARS,
       "description": "A summary id (sum_…) from a <summary> tag or a search result, or a message id."}

DEFINITIONS: tuple[dict[str, Any], ...] = (
    _function(GREP, "Search the whole history of this conversation, including the parts compacted into summaries, "
              "for a text. Returns matching messages and summaries, newest first, with the summary that now "
              "stands for each compacted message.", {
                  "pattern": {"type": "string", "minLength": 1, "maxLength": PATTERN_MAX_CHARS,
                              "description": "Text to find (case-insensitive), or a regular expression when "
                                             "regex is true."},
                  "scope": {"type": "string", "enum": ["messages", "summaries", "both"], "default": "both",
                            "description": "Search original messages, summaries, or both."},
                  "limit": {"type": "integer", "minimum": 1, "maximum": GREP_MAX_LIMIT,
                            "default": GREP_DEFAULT_LIMIT, "description": "Most matches to return."},
                  "regex": {"type": "boolean", "default": False,
                            "description": "Treat pattern as an RE2 regular expression."},
              }, ["pattern"]),
    _function(DESCRIBE, "Show one summary's place in the history: its kind, depth, time range, how many messages "
              "it stands for, the summaries above it, its direct sources, and its text.", {"id": _ID}, ["id"]),
    _function(EXPAND, "Open a summary: its direct sources (the messages or lower summaries it replaced), oldest "
              "first, up to a token cap. Given a message id, the full original message.", {
                  "id": _ID,
                  "tokenCap": {"type": "integer", "minimum": 1, "maximum": EXPAND_MAX_TOKEN_CAP,
                               "default": EXPAND_DEFAULT_TOKEN_CAP,
                               "description": "Most tokens of sources to return."},
              }, ["id"]),
    _function(QUERY, "Ask a question about the compacted history of this conversation. The history is searched, "
              "the best matches are opened, and an answer citing the ids it used comes back.", {
                  "question": {"type": "string", "minLength": 1, "maxLength": QUESTION_MAX_CHARS,
                               "description": "The question, with the names, paths or words to look for."},
              }, ["question"]),
)
"""Never built per call: the prompt-cache prefix of a provider starts with the tools."""

DEFINITIONS_JSON = json.dumps(list(DEFINITIONS), ensure_ascii=False, separators=(",", ":"))
"""The definitions as the JSON text every ``context/assemble`` with ``tools: true`` splices in."""


def definitions() -> list[dict[str, Any]]:
    """A fresh copy of the definitions, as a client hands them to its model."""
    return json.loads(DEFINITIONS_JSON)
