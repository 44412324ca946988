"""Settings: attrs classes with the defaults of docs/protocol.md, their ranges and choices as validators.

A client sends settings as camelCase JSON (``initializationOptions`` or the
``contextSidecar`` section of ``workspace/didChangeConfiguration``), read by
``read_settings`` with the wire converter's lenient mode: a value of the wrong
type or out of range is reported and replaced by its default; unknown keys are
reported and ignored. Nothing here touches I/O.
"""

from __future__ import annotations

import os
import re
from typing import Any

import attrs

from protocol.methods import COMPACTION_MODES
from sidecar.config.defaults import CACHE_READ_PRICE, CACHE_WRITE_PRICE, DEFAULT_MEMORY_LIMIT
from sidecar.wire import Replaced, structure_lenient

MEMORY_SIZE = re.compile(r"(\d+(?:\.\d+)?)\s*(B|KB|MB|GB|TB|KiB|MiB|GiB|TiB)", re.IGNORECASE)
_UNITS = {"b": 1, "kb": 1000, "mb": 1000**2, "gb": 1000**3, "tb": 1000**4,
          "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40}
MIN_MEMORY_LIMIT = "64MB"
"""Below this, writes of 40 KB tool outputs failed in DuckDB, their rollback too, invalidating the database."""
INT_MAX = 2**31 - 1


def size_in_bytes(size: str) -> float:
    """A DuckDB size such as '512MB' in bytes."""
    match = MEMORY_SIZE.fullmatch(size)
    if match is None:
        raise ValueError(f"not a size: {size!r}")
    return float(match.group(1)) * _UNITS[match.group(2).lower()]


@attrs.define(frozen=True)
class between:
    """Validator: the value lies in ``low..high``."""

    low: float
    high: float

    def __call__(self, instance: Any, attribute: Any, value: Any) -> None:
        if not self.low <= value <= self.high:
            high = int(self.high) if self.high == int(self.high) else self.high
            raise ValueError(f"{value!r} is outside {self.low:g}..{high}")


@attrs.define(frozen=True)
class one_of:
    """Validator: the value is one of ``choices``."""

    choices: tuple[str, ...]

    def __call__(self, instance: Any, attribute: Any, value: str) -> None:
        if value not in self.choices:
            raise ValueError(f"{value!r} is not one of {', '.join(self.choices)}")


@attrs.define(frozen=True)
class memory_size:
    """Validator: a DuckDB size such as '512MB' (or empty, for DuckDB's default), raised to ``floor``."""

    floor: str

    def __call__(self, instance: Any, attribute: Any, value: str) -> None:
        if not value:
            return
        if not MEMORY_SIZE.fullmatch(value):
            raise ValueError(f"{value!r} is not a size such as {DEFAULT_MEMORY_LIMIT!r}")
        if size_in_bytes(value) < size_in_bytes(self.floor):
            raise Replaced(f"{value!r} is below {self.floor}, under which DuckDB can fail writes of large tool "
                           "outputs and refuse the database", self.floor)


@attrs.define(frozen=True)
class StorageSettings:
    path: str | None = None
    """DuckDB file; ``:memory:`` for none. Default: one file in the user's data dir, for every workspace."""

    memory_limit: str = attrs.field(default=DEFAULT_MEMORY_LIMIT, validator=memory_size(MIN_MEMORY_LIMIT))
    """DuckDB ``memory_limit``; its buffer pool otherwise grows to gigabytes (trimmed after checkpoints)."""

    share: bool = True
    """Share the database with other context-sidecar processes through a host (false: open it in this process)."""


@attrs.define(frozen=True)
class CompactionSettings:
    auto: bool = True
    """Compact in the background when a session crosses its threshold."""

    mode: str = attrs.field(default="incremental", validator=one_of(COMPACTION_MODES))
    """Mode of automatic compaction: incremental, full or handoff."""

    max_tokens: int = attrs.field(default=80000, validator=between(-1, INT_MAX))
    """Absolute threshold in tokens when > 0; -1 turns auto-compaction off."""

    threshold: float = attrs.field(default=0.75, validator=between(0.01, 1.0))
    """Threshold as a fraction of the context window."""

    reserve_tokens: int = attrs.field(default=8192, validator=between(0, INT_MAX))
    """Tokens kept free for the model's reply; also caps the threshold and the default budget."""

    suggest_at: float = attrs.field(default=0.70, validator=between(0.01, 1.0))
    """Fraction of the window from which usage suggests compacting."""

    fresh_tail: int = attrs.field(default=20, validator=between(0, 100_000))
    """Newest messages always assembled and never compacted."""

    keep_recent_tokens: int = attrs.field(default=16384, validator=between(0, INT_MAX))
    """Handoff keeps at least this many recent tokens verbatim."""

    leaf_chunk_size: int = attrs.field(default=10, validator=between(1, 100_000))
    """Fewest messages a leaf summary replaces."""

    condensed_min_fanout: int = attrs.field(default=2, validator=between(2, 1_000))
    """Fewest same-depth summaries a condensed summary replaces."""

    max_rounds: int = attrs.field(default=10, validator=between(1, 1_000))
    """Most leaf+condensed rounds of one ``full`` compaction."""

    hook_timeout_seconds: float = attrs.field(default=10.0, validator=between(0.1, 3_600))
    """How long ``context/willCompact`` may go unanswered before the compaction proceeds."""

    min_savings: float = attrs.field(default=0.10, validator=between(0.0, 1.0))
    """A compaction saving less than this share of the context is skipped: its rewrite would not pay."""

    summarize_ahead: float = attrs.field(default=0.85, validator=between(0.1, 1.0))
    """Share of the threshold at which automatic compaction starts writing its summaries when a model writes them
    (a client's or ``llm``'s); they replace the history once the context reaches the threshold. 1: start there."""

    @property
    def automatic(self) -> bool:
        """Whether sessions compact on their own: ``auto`` on and ``maxTokens`` not -1."""
        return self.auto and self.max_tokens != -1


@attrs.define(frozen=True)
class PruneSettings:
    enabled: bool = True
    """Replace old tool outputs by a placeholder in assembled contexts."""

    protect_tokens: int = attrs.field(default=40000, validator=between(0, INT_MAX))
    """Newest tokens in which no tool output is pruned."""

    minimum_tokens: int = attrs.field(default=20000, validator=between(0, INT_MAX))
    """Prune only when the prunable outputs together exceed this."""

    max_tokens_per_part: int = attrs.field(default=50000, validator=between(1, INT_MAX))
    """Cap on the estimated tokens of one content part."""

    protected_tools: tuple[str, ...] = ("skill",)
    """Tools whose outputs are never pruned."""

    postpone_compaction: bool = False
    """Count pruned outputs as their placeholders toward the auto-compaction threshold, so pruning postpones compaction
    (more history kept verbatim, more input tokens sent); false: they count whole and only lower each turn's cost."""

    cache_read_price: float = attrs.field(default=CACHE_READ_PRICE, validator=between(0.0, 100.0))
    """Price of a prompt token read from the provider's cache, relative to an uncached one; with cacheWritePrice it
    decides whether a prune step pays back before the next compaction."""

    cache_write_price: float = attrs.field(default=CACHE_WRITE_PRICE, validator=between(0.0, 100.0))
    """Price of a prompt token written to the provider's cache (every token after a rewritten message), relative to
    an uncached one."""


@attrs.define(frozen=True)
class LlmSettings:
    base_url: str | None = None
    """OpenAI-compatible endpoint; None means the openai client's default."""

    model: str | None = None
    """Model used for summaries; None means the deterministic summarizer."""

    api_key_env: str = "OPENAI_API_KEY"
    """Environment variable holding the API key; the key itself is never stored."""

    timeout_seconds: float = attrs.field(default=120, validator=between(0.1, 86_400))
    """Timeout of one summarizer call."""

    max_concurrency: int = attrs.field(default=4, validator=between(1, 256))
    """Most summarizer calls in flight at once."""

    temperature: float = attrs.field(default=0.2, validator=between(0.0, 2.0))
    """Sampling temperature of summarizer calls."""

    max_calls_per_minute: int = attrs.field(default=60, validator=between(1, 100_000))
    """Most summarizer calls automatic compaction may make per minute; manual compaction is not limited."""

    context_window: int | None = attrs.field(default=None, validator=attrs.validators.optional(between(1024, INT_MAX)))
    """The summarizer model's window; every call is planned to fit it. None: the model table's, else 8192."""


@attrs.define(frozen=True)
class ModelInfo:
    context_window: int = attrs.field(validator=between(1, INT_MAX))
    """The model's context window in tokens."""


@attrs.define(frozen=True)
class AgentSettings:
    transcript_directories: tuple[str, ...] = ()
    """More directories of agent transcripts that ``memory/watch`` searches for a workspace's sessions (files whose
    recorded working directory is the workspace), beside the agents' own."""


@attrs.define(frozen=True)
class Settings:
    storage: StorageSettings = StorageSettings()
    """Where and how history is stored."""

    context_window: int = attrs.field(default=128000, validator=between(1, INT_MAX))
    """Context window of sessions that name none and whose model is unknown."""

    compaction: CompactionSettings = CompactionSettings()
    """When and how history is summarized."""

    prune: PruneSettings = PruneSettings()
    """How old tool outputs are pruned from assembled contexts."""

    llm: LlmSettings = LlmSettings()
    """The OpenAI-compatible summarizer, if any."""

    models: dict[str, ModelInfo] = attrs.field(factory=dict)
    """Context windows by model name, overriding the built-in table."""

    agents: AgentSettings = AgentSettings()
    """Where agents keep transcripts, beyond where they do by default (*extension*)."""


def read_settings(data: Any, base: Settings | None = None) -> tuple[Settings, list[str]]:
    """Settings from client JSON, over ``base``; returns them with the problems found."""
    problems: list[str] = []
    if data is None:
        return base or Settings(), problems
    return structure_lenient(data, Settings, base or Settings(), problems), problems


def summarizer_name(settings: Settings) -> str:
    """``openai`` when an LLM is usable (a model, and a key or a base URL), else ``deterministic``."""
    llm = settings.llm
    if llm.model and (os.environ.get(llm.api_key_env) or llm.base_url):
        return "openai"
    return "deterministic"
