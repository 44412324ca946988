"""bench/run.py --tiny runs end to end and reports every figure (no timing assertions)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1] / "bench" / "run.py"
FIGURES = [
    "init_ms", "rss_idle_mb", "ingest_single_p50_ms", "ingest_single_p99_ms", "ingest_batch_msgs_per_s",
    "rss_loaded_mb", "assemble_small_p50_ms", "assemble_small_p99_ms", "assemble_large_p50_ms",
    "assemble_large_p99_ms", "assemble_ratio", "grep_p50_ms", "rss_peak_mb",
]


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
    assert result["info"]["grep_matches"] > 0  # the needle is in the generated session
    assert "PASS" in done.stdout or "MISS" in done.stdout
