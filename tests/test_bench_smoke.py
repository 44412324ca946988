"""bench/run.py --tiny runs end to end and reports every figure (no timing assertions)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "bench" / "run.py"
PI_SESSION = ROOT.parent / "shared" / "data" / "pi-large-session.jsonl"
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
]


@pytest.mark.skipif(not PI_SESSION.exists(), reason="shared/data is not beside the project")
def test_tiny_benchmark_reports_every_figure(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    done = subprocess.run([sys.executable, str(BENCH), "--tiny", "--json", str(out)],
                          capture_output=True, text=True, timeout=120)
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
    assert "PASS" in done.stdout or "MISS" in done.stdout
