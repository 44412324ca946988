"""Transcript parsers: pi, Claude Code, Codex CLI and plain OpenAI JSON into OpenAI chat messages."""

from __future__ import annotations

import importlib
from pathlib import Path

from sidecar.importers.common import WINDOW, ImportFormatError, ParsedTranscript, Window
from sidecar.importers.detect import detect_format

FORMATS = ("pi", "claude-code", "codex", "openai")
# Imported on first use so that the server pays only for the parser it needs.
_MODULES = {
    "pi": "sidecar.importers.pi",
    "claude-code": "sidecar.importers.claude_code",
    "codex": "sidecar.importers.codex",
    "openai": "sidecar.importers.openai_json",
}

RESUME_ROLES = {"claude-code": ("user", "assistant"), "pi": ("user", "assistant"), "codex": ("user",)}
"""Per format, the messages a window may start at (see ``common.resume_line``): Codex attaches a response's token
count, written after its tool outputs, to the response, so only prompts qualify there."""

__all__ = ["FORMATS", "RESUME_ROLES", "ImportFormatError", "ParsedTranscript", "Window",
           "detect_format", "parse_transcript"]


def parse_transcript(path: str | Path, format: str = "auto", follow: bool = False,
                     window: Window | None = None) -> ParsedTranscript:
    """Read a transcript file into OpenAI chat messages; format is one of FORMATS or "auto".

    ``follow``: the file is being written, so a last line without its newline is left for a later read.
    ``window``: read only that part of the file: what it yields for the messages there is what reading it whole
    would, when the window starts at a line ``common.resume_line`` chose.
    """
    path = Path(path)
    if format == "auto":
        detected = detect_format(path)
        if detected is None:
            return ParsedTranscript(format="empty")
        format = detected
    if format not in _MODULES:
        raise ImportFormatError(f"unknown transcript format {format!r}; expected auto or one of {FORMATS}")
    module = importlib.import_module(_MODULES[format])
    token = WINDOW.set(window)
    try:
        return module.parse(path, follow=follow)
    finally:
        WINDOW.reset(token)
