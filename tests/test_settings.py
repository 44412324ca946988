"""Settings as the lenient reader takes them from a client: what is kept, what is replaced, what is said."""

from __future__ import annotations

import attrs
import pytest

from sidecar.config.settings import INT_MAX, Settings, between, read_settings
from sidecar.wire import camel


def test_values_out_of_range_or_of_the_wrong_type_fall_back_to_their_default_and_are_reported() -> None:
    settings, problems = read_settings({"compaction": {"freshTail": -1, "threshold": "high", "leafChunkSize": 3},
                                        "contextWindow": 0})
    assert settings.compaction.fresh_tail == 20 and settings.compaction.threshold == 0.75
    assert settings.compaction.leaf_chunk_size == 3 and settings.context_window == 128000
    assert problems == ["compaction.freshTail: -1 is outside 0..100000; using the default 20",
                        "compaction.threshold: expected a number, got the string 'high'; using the default 0.75",
                        "contextWindow: 0 is outside 1..2147483647; using the default 128000"]


def test_a_mode_that_is_not_a_compaction_mode_is_refused() -> None:
    settings, problems = read_settings({"compaction": {"mode": "summary"}})
    assert settings.compaction.mode == "incremental"
    assert problems == ["compaction.mode: 'summary' is not one of incremental, full, handoff; "
                        "using the default 'incremental'"]


def test_a_memory_limit_below_the_floor_is_raised_to_it_and_a_non_size_gets_the_default() -> None:
    low, said = read_settings({"storage": {"memoryLimit": "8MB"}})
    assert low.storage.memory_limit == "64MB" and "is below 64MB" in said[0] and said[0].endswith("using '64MB'")
    bad, said = read_settings({"storage": {"memoryLimit": "plenty"}})
    assert bad.storage.memory_limit == "512MB" and "not a size" in said[0]
    empty, said = read_settings({"storage": {"memoryLimit": ""}})
    assert empty.storage.memory_limit == "" and said == []


def test_unknown_keys_are_ignored_snake_case_is_accepted_and_the_rest_is_kept() -> None:
    settings, problems = read_settings({"bogus": 1, "prune": {"protect_tokens": 10, "protectedTools": ["read"]}})
    assert settings.prune.protect_tokens == 10 and settings.prune.protected_tools == ("read",)
    assert problems == ["bogus: unknown setting, ignored"]


def test_a_bad_entry_of_a_list_names_its_index_and_keeps_the_default() -> None:
    settings, problems = read_settings({"prune": {"protectedTools": ["read", 7]}})
    assert settings.prune.protected_tools == ("skill",)
    assert problems == ["prune.protectedTools[1]: expected a string, got the number 7; using the default ('skill',)"]


def test_models_drop_bad_entries_one_by_one() -> None:
    settings, problems = read_settings({"models": {"ok": {"contextWindow": 5000}, "zero": {"contextWindow": 0},
                                                   "text": "big"}})
    assert list(settings.models) == ["ok"] and settings.models["ok"].context_window == 5000
    assert len(problems) == 2 and problems[0].startswith("models.zero:") and problems[1].startswith("models.text:")


def test_a_section_that_is_not_an_object_keeps_its_values() -> None:
    base, _ = read_settings({"llm": {"maxConcurrency": 2}})
    settings, problems = read_settings({"llm": None}, base)
    assert settings.llm.max_concurrency == 2
    assert problems == ["llm: expected an object, got null; using defaults"]


def test_every_default_passes_its_own_validators_and_every_numeric_field_has_a_range() -> None:
    Settings()  # attrs runs the validators
    unchecked = [f"{section.name}.{field.name}" for section in attrs.fields(Settings) if attrs.has(section.type)
                 for field in attrs.fields(section.type)
                 if field.type in ("int", "float") and field.validator is None]
    assert unchecked == []


@pytest.mark.parametrize("value, ok", [(1, True), (INT_MAX, True), (0, False), (INT_MAX + 1, False)])
def test_between_is_inclusive(value: int, ok: bool) -> None:
    field = attrs.fields(Settings).context_window
    if ok:
        between(1, INT_MAX)(None, field, value)
    else:
        with pytest.raises(ValueError, match=f"{value} is outside 1..{INT_MAX}"):
            between(1, INT_MAX)(None, field, value)
    assert camel(field.name) == "contextWindow"


@pytest.mark.parametrize("value", [0, 1.5, "0.8", None, True])
def test_a_bad_summarize_ahead_is_reported_and_its_default_used(value: object) -> None:
    settings, problems = read_settings({"compaction": {"summarizeAhead": value, "minSavings": 0.2}})
    assert settings.compaction.summarize_ahead == 0.85 and settings.compaction.min_savings == 0.2
    assert len(problems) == 1 and "summarizeAhead" in problems[0]
