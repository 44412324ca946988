"""Settings: attrs classes with the defaults of PROTOCOL.md, and a lenient reader.

A client sends settings as camelCase JSON (``initializationOptions`` or the
``contextSidecar`` section of ``workspace/didChangeConfiguration``). A value
of the wrong type is reported and replaced by its default; unknown keys are
reported and ignored. Nothing here touches I/O.
"""

from __future__ import annotations

import os
import re
import types
import typing
from typing import Any

import attrs

MEMORY_SIZE = re.compile(r"(\d+(?:\.\d+)?)\s*(B|KB|MB|GB|TB|KiB|MiB|GiB|TiB)", re.IGNORECASE)
_UNITS = {"b": 1, "kb": 1000, "mb": 1000**2, "gb": 1000**3, "tb": 1000**4,
          "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40}
MIN_MEMORY_LIMIT = "64MB"
"""Below this, writes of 40 KB tool outputs failed in DuckDB, their rollback too, invalidating the database."""


@attrs.define(frozen=True)
class StorageSettings:
    path: str | None = None
    """DuckDB file; ``:memory:`` for none. Default: per-workspace file in the user's data dir."""

    memory_limit: str = "512MB"
    """DuckDB ``memory_limit``; its buffer pool otherwise grows to gigabytes (trimmed after checkpoints)."""


@attrs.define(frozen=True)
class CompactionSettings:
    auto: bool = True
    """Compact in the background when a session crosses its threshold."""

    mode: str = "incremental"
    """Mode of automatic compaction: incremental, full or handoff."""

    max_tokens: int = 80000
    """Absolute threshold in tokens when > 0; -1 turns auto-compaction off."""

    threshold: float = 0.75
    """Threshold as a fraction of the context window."""

    reserve_tokens: int = 8192
    """Tokens kept free for the model's reply; also caps the threshold and the default budget."""

    suggest_at: float = 0.70
    """Fraction of the window from which usage suggests compacting."""

    fresh_tail: int = 20
    """Newest messages always assembled and never compacted."""

    keep_recent_tokens: int = 16384
    """Handoff keeps at least this many recent tokens verbatim."""

    leaf_chunk_size: int = 10
    """Fewest messages a leaf summary replaces."""

    condensed_min_fanout: int = 2
    """Fewest same-depth summaries a condensed summary replaces."""

    max_rounds: int = 10
    """Most leaf+condensed rounds of one ``full`` compaction."""

    min_savings: float = 0.10
    """A compaction saving less than this share of the context is skipped: its rewrite would not pay."""


@attrs.define(frozen=True)
class PruneSettings:
    enabled: bool = True
    """Replace old tool outputs by a placeholder in assembled contexts."""

    protect_tokens: int = 40000
    """Newest tokens in which no tool output is pruned."""

    minimum_tokens: int = 20000
    """Prune only when the prunable outputs together exceed this."""

    max_tokens_per_part: int = 50000
    """Cap on the estimated tokens of one content part."""

    protected_tools: tuple[str, ...] = ("skill",)
    """Tools whose outputs are never pruned."""


@attrs.define(frozen=True)
class LlmSettings:
    base_url: str | None = None
    """OpenAI-compatible endpoint; None means the openai client's default."""

    model: str | None = None
    """Model used for summaries; None means the deterministic summarizer."""

    api_key_env: str = "OPENAI_API_KEY"
    """Environment variable holding the API key; the key itself is never stored."""

    timeout_seconds: float = 120
    """Timeout of one summarizer call."""

    max_concurrency: int = 4
    """Most summarizer calls in flight at once."""

    temperature: float = 0.2
    """Sampling temperature of summarizer calls."""

    max_calls_per_minute: int = 60
    """Most summarizer calls automatic compaction may make per minute; manual compaction is not limited."""


@attrs.define(frozen=True)
class ModelInfo:
    context_window: int
    """The model's context window in tokens."""


@attrs.define(frozen=True)
class Settings:
    storage: StorageSettings = StorageSettings()
    """Where and how history is stored."""

    context_window: int = 128000
    """Context window of sessions that name none and whose model is unknown."""

    compaction: CompactionSettings = CompactionSettings()
    """When and how history is summarized."""

    prune: PruneSettings = PruneSettings()
    """How old tool outputs are pruned from assembled contexts."""

    llm: LlmSettings = LlmSettings()
    """The OpenAI-compatible summarizer, if any."""

    models: dict[str, ModelInfo] = attrs.field(factory=dict)
    """Context windows by model name, overriding the built-in table."""


def camel(name: str) -> str:
    """``max_tokens`` -> ``maxTokens``."""
    head, *rest = name.split("_")
    return head + "".join(word.title() for word in rest)


def snake(name: str) -> str:
    """``maxTokens`` -> ``max_tokens``."""
    return re.sub(r"(?<!^)([A-Z])", r"_\1", name).lower()


INT_MAX = 2**31 - 1
RANGES: dict[str, tuple[float, float]] = {
    "contextWindow": (1, INT_MAX),
    "compaction.maxTokens": (-1, INT_MAX),
    "compaction.threshold": (0.01, 1.0),
    "compaction.reserveTokens": (0, INT_MAX),
    "compaction.suggestAt": (0.01, 1.0),
    "compaction.freshTail": (0, 100_000),
    "compaction.keepRecentTokens": (0, INT_MAX),
    "compaction.leafChunkSize": (1, 100_000),
    "compaction.condensedMinFanout": (2, 1_000),
    "compaction.maxRounds": (1, 1_000),
    "compaction.minSavings": (0.0, 1.0),
    "prune.protectTokens": (0, INT_MAX),
    "prune.minimumTokens": (0, INT_MAX),
    "prune.maxTokensPerPart": (1, INT_MAX),
    "llm.timeoutSeconds": (0.1, 86_400),
    "llm.maxConcurrency": (1, 256),
    "llm.temperature": (0.0, 2.0),
    "llm.maxCallsPerMinute": (1, 100_000),
}
"""Allowed ranges, by camelCase path; a value outside is reported and replaced by its default."""
MODES = ("incremental", "full", "handoff")


def read_settings(data: Any, base: Settings | None = None) -> tuple[Settings, list[str]]:
    """Settings from client JSON, over ``base``; returns them with the problems found."""
    problems: list[str] = []
    if data is None:
        return base or Settings(), problems
    settings = _read_class(Settings, data, base or Settings(), "", problems)
    return _check_ranges(settings, problems), problems


def _check_ranges(settings: Settings, problems: list[str]) -> Settings:
    defaults = Settings()
    for path, (low, high) in RANGES.items():
        section, _, name = path.rpartition(".")
        holder = getattr(settings, snake(section)) if section else settings
        value = getattr(holder, snake(name))
        if not low <= value <= high:
            default = getattr(getattr(defaults, snake(section)) if section else defaults, snake(name))
            problems.append(f"{path}: {value!r} is outside {low:g}..{int(high) if high == int(high) else high}; "
                            f"using the default {default!r}")
            settings = _with(settings, section, snake(name), default)
    if settings.compaction.mode not in MODES:
        problems.append(f"compaction.mode: {settings.compaction.mode!r} is not one of {', '.join(MODES)}; "
                        "using the default 'incremental'")
        settings = _with(settings, "compaction", "mode", "incremental")
    if settings.storage.memory_limit and not MEMORY_SIZE.fullmatch(settings.storage.memory_limit):
        problems.append(f"storage.memoryLimit: {settings.storage.memory_limit!r} is not a size such as '512MB'; "
                        "using the default '512MB'")
        settings = _with(settings, "storage", "memory_limit", "512MB")
    elif settings.storage.memory_limit and size_in_bytes(settings.storage.memory_limit) < size_in_bytes(
            MIN_MEMORY_LIMIT):
        problems.append(f"storage.memoryLimit: {settings.storage.memory_limit!r} is below {MIN_MEMORY_LIMIT}, under "
                        f"which DuckDB can fail writes of large tool outputs and refuse the database; "
                        f"using {MIN_MEMORY_LIMIT}")
        settings = _with(settings, "storage", "memory_limit", MIN_MEMORY_LIMIT)
    return settings


def size_in_bytes(size: str) -> float:
    """A DuckDB size such as '512MB' in bytes."""
    match = MEMORY_SIZE.fullmatch(size)
    if match is None:
        raise ValueError(f"not a size: {size!r}")
    return float(match.group(1)) * _UNITS[match.group(2).lower()]


def _with(settings: Settings, section: str, name: str, value: Any) -> Settings:
    if not section:
        return attrs.evolve(settings, **{name: value})
    return attrs.evolve(settings, **{section: attrs.evolve(getattr(settings, section), **{name: value})})


def _read_class(cls: type, data: Any, base: Any, path: str, problems: list[str]) -> Any:
    if not isinstance(data, dict):
        problems.append(f"{path or 'settings'}: expected an object, got {describe_json(data)}; using defaults")
        return base
    hints = typing.get_type_hints(cls)
    fields = {camel(f.name): f for f in attrs.fields(cls)}
    changes: dict[str, Any] = {}
    for key, value in data.items():
        field = fields.get(key) or fields.get(camel(snake(key)))
        where = f"{path}{key}"
        if field is None:
            problems.append(f"{where}: unknown setting, ignored")
            continue
        default = getattr(type(base)(), field.name)
        changes[field.name] = _read_value(hints[field.name], value, getattr(base, field.name), default,
                                          where, problems)
    return attrs.evolve(base, **changes)


def _read_value(hint: Any, value: Any, current: Any, default: Any, where: str, problems: list[str]) -> Any:
    if attrs.has(hint):
        return _read_class(hint, value, current, f"{where}.", problems)
    origin = typing.get_origin(hint)
    if origin is dict:
        if not isinstance(value, dict):
            return _reject(where, value, "an object", default, problems)
        return {name: info for name, entry in value.items()
                if (info := _read_model(entry, f"{where}.{name}", problems)) is not None}
    if origin is tuple:
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            return _reject(where, value, "a list of strings", default, problems)
        return tuple(value)
    allowed = typing.get_args(hint) if origin in (typing.Union, types.UnionType) else (hint,)
    if value is None and type(None) in allowed:
        return None
    for kind in allowed:
        if kind is bool and isinstance(value, bool):
            return value
        if kind is int and isinstance(value, int) and not isinstance(value, bool):
            return value
        if kind is float and isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if kind is str and isinstance(value, str):
            return value
    wanted = " or ".join("null" if k is type(None) else k.__name__ for k in allowed)
    return _reject(where, value, wanted, default, problems)


def _read_model(entry: Any, where: str, problems: list[str]) -> ModelInfo | None:
    window = entry.get("contextWindow") if isinstance(entry, dict) else None
    if isinstance(window, int) and not isinstance(window, bool) and window > 0:
        return ModelInfo(context_window=window)
    problems.append(f"{where}: expected {{\"contextWindow\": positive integer}}; entry ignored")
    return None


def _reject(where: str, value: Any, wanted: str, default: Any, problems: list[str]) -> Any:
    problems.append(f"{where}: expected {wanted}, got {describe_json(value)}; using the default {default!r}")
    return default


def describe_json(value: Any) -> str:
    """A JSON value as an error message names it: ``null``, ``a boolean``, ``the string 'x'``…"""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return f"the number {value!r}"
    if isinstance(value, str):
        return f"the string {value!r}"
    if isinstance(value, list):
        return "a list"
    return "an object"


def summarizer_name(settings: Settings) -> str:
    """``openai`` when an LLM is usable (a model, and a key or a base URL), else ``deterministic``."""
    llm = settings.llm
    if llm.model and (os.environ.get(llm.api_key_env) or llm.base_url):
        return "openai"
    return "deterministic"
