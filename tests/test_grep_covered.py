"""memory/grep's coveredBy, found for all matches at once, agrees with the lineage walked step by step."""

from __future__ import annotations

from protocol import methods
from tests.conftest import call, ingest, running_sidecar, settings_for


async def test_covered_by_is_the_context_summary_above_each_compacted_match(db_path):
    settings = settings_for(db_path, compaction={"auto": False, "freshTail": 6, "leafChunkSize": 4, "maxTokens": 600})
    async with running_sidecar(settings=settings) as client:
        await ingest(client, "s", [{"id": f"m{i}", "role": "user", "content": f"step {i}: needle-{i % 3}"}
                                   for i in range(90)])
        first = await call(client, methods.CONTEXT_COMPACT, {"sessionId": "s", "mode": "incremental"})
        await ingest(client, "s", [{"id": f"late{i}", "role": "user", "content": f"late needle-{i}"}
                                   for i in range(30)])
        second = await call(client, methods.CONTEXT_COMPACT, {"sessionId": "s", "mode": "full"})
        assert first["compacted"] and second["compacted"] and second["rounds"] >= 1
        await ingest(client, "s", [{"id": "live", "role": "user", "content": "live needle-x"}])
        grep = await call(client, methods.MEMORY_GREP, {"sessionId": "s", "pattern": "needle", "scope": "messages",
                                                        "limit": 1000})
        context = {item["id"] for item in (await call(client, methods.CONTEXT_ASSEMBLE,
                                                      {"sessionId": "s", "budget": 10**6}))["items"]}
        assert len(grep["matches"]) == 121
        depths = set()
        for match in grep["matches"]:
            expected, depth, current = None, 0, match["id"]
            while current not in context:  # walk up one parent at a time, as the old per-match code did
                parents = (await call(client, methods.MEMORY_DESCRIBE, {"sessionId": "s", "id": current}))["parents"]
                assert len(parents) == 1
                current, depth = parents[0], depth + 1
                expected = current
            depths.add(depth)
            assert match.get("coveredBy") == expected, match
    assert 0 in depths and max(depths) >= 2, "matches in the context, and some several summaries deep"
