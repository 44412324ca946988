"""Latency of ``context-sidecar import --follow``: from a line appended to a pi session file to its stored report.

Run: ``.venv/bin/python bench/follow.py [--appends N]``. Prints each latency and the median and maximum.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path


async def measure(appends: int) -> list[float]:
    """Seconds from each append to the follower's line saying it stored it."""
    with tempfile.TemporaryDirectory(prefix="bench-follow-") as directory:
        live = Path(directory) / "session.jsonl"
        header = {"type": "session", "version": 3, "id": "bench", "timestamp": "2026-01-01T00:00:00Z", "cwd": "/x"}
        live.write_text(json.dumps(header) + "\n")
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "sidecar", "import", "--follow", str(live), "--db", f"{directory}/m.duckdb",
            stdout=asyncio.subprocess.PIPE)
        assert process.stdout is not None
        for _ in range(2):  # the "following" and "storage" lines
            await process.stdout.readline()
        latencies: list[float] = []
        parent = None
        for index in range(appends):
            entry = {"type": "message", "id": f"m{index}", "parentId": parent, "timestamp": "2026-01-01T00:00:01Z",
                     "message": {"role": "user", "content": f"line {index} " + "x" * 200}}
            parent = f"m{index}"
            start = time.monotonic()
            with live.open("a") as fh:
                fh.write(json.dumps(entry) + "\n")
            while "+1 message" not in (await asyncio.wait_for(process.stdout.readline(), 30)).decode():
                pass
            latencies.append(time.monotonic() - start)
        process.terminate()
        await process.wait()
    return latencies


def main() -> None:
    """Print the figures."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--appends", type=int, default=20)
    latencies = asyncio.run(measure(parser.parse_args().appends))
    print("append → stored (ms):", [round(x * 1000) for x in latencies])
    print(f"median {statistics.median(latencies) * 1000:.0f} ms, max {max(latencies) * 1000:.0f} ms "
          f"(polling every 200 ms; the target is under 1 s)")


if __name__ == "__main__":
    main()
