"""bench/run.py --tiny runs end to end and reports every figure (no timing assertions)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import PI_SESSION

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "bench" / "run.py"
FIGURES = [
    "init_ms", "rss_idle_mb", "ingest_single_p50_ms", "ingest_single_p99_ms", "ingest_batch_msgs_per_s",
    "rss_loaded_mb", "assemble_small_p50_ms", "assemble_small_p99_ms", "assemble_large_p50_ms",
    "assemble_large_p99_ms", "assemble_ratio", "grep_p50_ms", "rss_peak_mb",
    "assemble_delta_small_p50_ms", "assemble_delta_large_p50_ms", "assemble_turn_full_small_p50_ms",
    "assemble_turn_full_large_p50_ms", "assemble_delta_ratio",
    *(f"prune_{session}_{state}_p{p}_ms" for session in ("pi", "generated") for state in ("on", "off")
      for p in (50, 99)),
    "prune_pi_ratio", "prune_generated_ratio", "prune_pi_off_equal_p50_ms", "prune_generated_off_equal_p50_ms",
    "prune_pi_ratio_equal", "prune_generated_ratio_equal",
    "compact_tokens_before", "compact_concurrency_ratio",
    *(f"compact_{variant}_{what}" for variant in ("llm1", "llm4", "det")
      for what in ("wall_s", "calls", "rounds", "tokens_after", "db_ms")),
    "grep_5k_before_ms", "grep_5k_after_ms", "grep_5k_ratio",
    *(f"window_{mode}_{what}" for mode in ("incremental", "full", "handoff")
      for what in ("wall_s", "calls", "rounds", "largest_prompt")),
    *(f"share_{what}_{how}" for what in ("ingest", "assemble") for how in ("direct_p50_ms", "relay_p50_ms",
                                                                            "relay_ratio")),
    "share_init_alone_ms", "share_init_first_ms", "share_init_warm_ms",
    "share_one_msgs_per_s", "share_eight_msgs_per_s", "share_eight_ratio", "share_recovery_s",
    *(f"follow_{size}_{what}" for size in ("small", "5mb")
      for what in ("import_s", "lag_p50_ms", "lag_max_ms", "cpu_ms", "others_p50_ms", "others_max_ms")),
    *(f"mcp_{what}_{stat}_ms" for what in ("tools_list", "first_call_cold", "first_call_warm")
      for stat in ("p50", "max")),
    "hook_precompact_cold_s", "hook_precompact_warm_s", "hook_sessionstart_warm_s",
]
CACHE = [f"cache_{session}_{what}" for session in ("pi", "generated")
         for what in ("hit_rate", "cost", "off_hit_rate", "off_cost", "cost_ratio")]
RETENTION = [f"retention_{variant}_{what}" for variant in ("det", "llm") for what in ("rules", "notes")]


@pytest.mark.skipif(not PI_SESSION.exists(), reason="shared/data is not beside the project")
@pytest.mark.timeout(900)  # every section once: about 2 min alone, over 5 on a busy 2-core machine
def test_tiny_benchmark_reports_every_figure(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    done = subprocess.run([sys.executable, str(BENCH), "--tiny", "--json", str(out)],
                          capture_output=True, text=True, timeout=840)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(out.read_text())
    figures = result["figures"]
    for key in FIGURES:
        assert isinstance(figures.get(key), (int, float)) and figures[key] > 0, key
    assert set(result["targets"]) <= set(figures)
    assert all(isinstance(check["pass"], bool) for check in result["targets"].values())
    info = result["info"]
    assert info["grep_matches"] > 0  # the needle is in the generated session
    assert info["prune_generated_on_pruned"] > 0  # pruning really happened in the on runs
    assert info["assemble_delta_small_share"] > 0.5 and info["assemble_delta_large_share"] > 0.5  # deltas came
    assert info["compact_llm1_max_in_flight"] == 1 and info["compact_llm4_max_in_flight"] > 1
    assert info["compact_llm1_http_requests"] == figures["compact_llm1_calls"]  # the log line counts the calls
    assert figures["compact_llm1_tokens_after"] < figures["compact_tokens_before"]
    assert info["grep_5k_covered"] > 0  # the grep after compaction found covering summaries
    assert all(figures[f"window_{mode}_rejected"] == 0 for mode in ("incremental", "full", "handoff"))
    assert "PASS" in done.stdout or "MISS" in done.stdout

    # Prompt cache: every replay repeats some prefix after its first prompt, and both runs step the same turns.
    for key in CACHE:
        assert isinstance(figures.get(key), (int, float)) and figures[key] > 0, key
        assert not key.endswith("hit_rate") or figures[key] <= 1, key
    for session in ("pi", "generated"):
        assert info[f"cache_{session}_on_prompts"] == info[f"cache_{session}_off_prompts"] > 1
        cost_ratio = figures[f"cache_{session}_cost"] / figures[f"cache_{session}_off_cost"]
        assert figures[f"cache_{session}_cost_ratio"] == pytest.approx(cost_ratio, abs=0.002)
    # Rule retention: a share in [0, 1], or for pinned notes n/a with its reason until the server keeps `pinned`.
    for key in RETENTION:
        value = figures.get(key, "absent")
        if value is None:
            assert key.endswith("_notes") and result["missing"][key].startswith("pinned unsupported"), key
            assert f"n/a ({result['missing'][key]})" in done.stdout
        else:
            assert isinstance(value, (int, float)) and 0 <= value <= 1, key
    assert info["retention_det_planted"]["rules"] > 0 and info["retention_llm_planted"]["notes"] > 0
    assert info["retention_det_compaction"]["compacted"] and info["retention_llm_compaction"]["compacted"]
    assert info["retention_llm_http_requests"] > 0  # the LLM variant summarized through the test server
