"""Each session's runtime is one object, shared by a host's connections, with its updates as its own methods."""

from __future__ import annotations

from sidecar.config.settings import Settings
from sidecar.engine.assembly import PruneStep
from sidecar.services.prompt import Prompt
from sidecar.services.runtime import MAX_BACKOFF, MAX_PROMPTS, Runtime
from sidecar.services.state import Sidecar


def prompt(revision: str) -> Prompt:
    return Prompt(revision=revision, key=(1000, 8, True, False), messages=[b"{}"], anchor=None, summaries=0,
                  frontier=0, settings=None, calibration=1.0, last_position=0, tokens=10, over_budget=False,
                  leading=[], raw=[10], session_revision=1)


def test_a_hosts_connections_share_one_runtime() -> None:
    host = Sidecar(storage_path=":memory:")
    first, second = host.attached(), host.attached()
    first.runtime.of("s").compacting = True
    assert second.runtime.compacting("s") and host.runtime.compacting()
    assert first.revision_prefix != second.revision_prefix  # revisions stay each connection's own


def test_forgetting_a_session_drops_its_object_and_only_it() -> None:
    runtime = Runtime()
    runtime.of("a").note_cache_hits(50, 100)
    runtime.keep_prompt("b", prompt("r1"))
    runtime.forget("a")
    assert runtime.get("a") is None and runtime.get("b") is not None
    assert runtime.of("a").cache_hits is None  # made again, empty


def test_a_reopened_database_keeps_prompts_and_cache_figures_and_resets_the_rest() -> None:
    runtime = Runtime()
    state = runtime.of("s")
    runtime.keep_prompt("s", prompt("r1"))
    state.note_cache_hits(30, 100)
    state.note_assembled(3, 500.0)
    state.calibration_sample(500.0, 600)
    state.remember_calls({"call_1": "read"})
    state.remember_prune(("key",), PruneStep(4))
    state.note_prompt(800)
    state.back_off(0.0)
    state.note_idle(12, "nothing to compact")
    state.compacting = True
    runtime.rendered.put(1, False, b"{}", "")
    runtime.forget()
    assert state.prompt is not None and state.cache_hits == (0.3, 0.3) and state.compacting
    assert (state.assembled, state.samples, state.recent_calls, state.prune_memo, state.backoff, state.idle_at) == \
        (None, [], {}, None, None, None)
    assert state.growth == (None, 0, None) and runtime.rendered.get(1, False) is None


def test_a_settings_change_drops_only_the_judgments_made_under_the_old_settings() -> None:
    runtime = Runtime()
    mine, theirs = Settings(), Settings()
    runtime.of("a").note_idle(12, "nothing to compact", mine)
    runtime.of("b").back_off(0.0, mine)
    runtime.of("c").note_idle(12, "nothing to compact", theirs)
    runtime.of("a").calibration_sample(500.0, 600)
    runtime.rendered.put(1, False, b"{}", "")
    runtime.reconsider(mine)
    assert runtime.of("a").idle_at is None and runtime.of("b").backoff is None
    assert runtime.of("c").idle_at == (12, "nothing to compact")
    assert runtime.of("a").samples and runtime.rendered.get(1, False) is not None


def test_prompts_are_kept_for_the_most_recently_assembled_sessions() -> None:
    runtime = Runtime()
    for index in range(MAX_PROMPTS + 2):
        runtime.keep_prompt(f"s{index}", prompt(f"r{index}"))
    kept = [session for session, state in runtime.sessions.items() if state.prompt is not None]
    assert len(kept) == MAX_PROMPTS and "s0" not in kept and "s1" not in kept
    runtime.keep_prompt("s2", prompt("again"))  # assembled again: the most recent now
    runtime.keep_prompt("new", prompt("r"))
    kept = [session for session, state in runtime.sessions.items() if state.prompt is not None]
    assert len(kept) == MAX_PROMPTS and "s2" in kept and "s3" not in kept and "new" in kept


def test_back_off_doubles_to_its_cap_and_holds_back_until_it_ends() -> None:
    state = Runtime().of("s")
    delays = [state.back_off(100.0) for _ in range(8)]
    assert delays[:2] == [30.0, 60.0] and delays[-1] == MAX_BACKOFF
    assert state.backed_off(100.0 + MAX_BACKOFF - 1) and not state.backed_off(100.0 + MAX_BACKOFF)
    state.clear_backoff()
    assert not state.backed_off(100.0)


def test_calibration_basis_holds_only_for_the_revision_assembled() -> None:
    state = Runtime().of("s")
    assert state.calibration_basis(1) is None
    state.note_assembled(1, 900.0)
    assert state.calibration_basis(1) == 900.0 and state.calibration_basis(2) is None


def test_a_fixed_prompt_overhead_is_told_from_a_ratio() -> None:
    state = Runtime().of("s")
    for basis in (1000.0, 2000.0, 3000.0):
        sample = state.calibration_sample(basis, round(1.2 * basis + 5000))  # 20% more tokens, 5,000 of tools
    assert abs(sample - 1.2) < 1e-9
