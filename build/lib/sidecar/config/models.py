"""Context windows of widely used models, for sessions that name a model but no window.

Figures are the providers' published context windows (input + output) as listed
in their model documentation, collected 2026-11. A ``models`` setting overrides
or extends the table; names match exactly, then by the longest known prefix,
ignoring a ``provider/`` prefix (``openrouter/anthropic/claude-sonnet-4-5``).
"""

from __future__ import annotations

from collections.abc import Mapping

from sidecar.config.settings import ModelInfo

BUILT_IN_CONTEXT_WINDOWS: dict[str, int] = {
    # OpenAI
    "gpt-5.1-codex": 400_000,
    "gpt-5.1": 400_000,
    "gpt-5-codex": 400_000,
    "gpt-5-mini": 400_000,
    "gpt-5-nano": 400_000,
    "gpt-5": 400_000,
    "gpt-4.1": 1_047_576,
    "gpt-4.1-mini": 1_047_576,
    "gpt-4.1-nano": 1_047_576,
    "gpt-4o": 128_000,
    "gpt-4o-mini": 128_000,
    "gpt-4-turbo": 128_000,
    "o1": 200_000,
    "o3": 200_000,
    "o3-mini": 200_000,
    "o4-mini": 200_000,
    "codex-mini-latest": 200_000,
    # Anthropic
    "claude-opus-4-1": 200_000,
    "claude-opus-4": 200_000,
    "claude-sonnet-4-5": 200_000,
    "claude-sonnet-4": 200_000,
    "claude-haiku-4-5": 200_000,
    "claude-3-7-sonnet": 200_000,
    "claude-3-5-sonnet": 200_000,
    "claude-3-5-haiku": 200_000,
    # Google
    "gemini-2.5-pro": 1_048_576,
    "gemini-2.5-flash": 1_048_576,
    "gemini-2.0-flash": 1_048_576,
    # Others served through OpenAI-compatible APIs
    "deepseek-chat": 128_000,
    "deepseek-reasoner": 128_000,
    "grok-4": 256_000,
    "grok-code-fast-1": 256_000,
    "kimi-k2": 131_072,
    "qwen3-coder": 262_144,
    "glm-4.6": 200_000,
    "mistral-large-latest": 131_072,
    "codestral-latest": 256_000,
}


def context_window_for(model: str | None, overrides: Mapping[str, ModelInfo]) -> int | None:
    """The model's context window from the settings or the built-in table; None when unknown."""
    if not model:
        return None
    for name in (model, model.rsplit("/", 1)[-1]):
        if name in overrides:
            return overrides[name].context_window
        if name in BUILT_IN_CONTEXT_WINDOWS:
            return BUILT_IN_CONTEXT_WINDOWS[name]
    bare = model.rsplit("/", 1)[-1]
    table = {**BUILT_IN_CONTEXT_WINDOWS, **{k: v.context_window for k, v in overrides.items()}}
    prefixes = [name for name in table if bare.startswith(name)]
    return table[max(prefixes, key=len)] if prefixes else None
