"""Benchmark sections: each is ``async def section(bench: Bench) -> None`` recording figures."""
