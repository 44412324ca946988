"""Defaults used outside the settings classes too (the command line, the replay's price table)."""

DEFAULT_MEMORY_LIMIT = "512MB"
"""DuckDB's ``memory_limit`` unless ``storage.memoryLimit`` says otherwise."""

CACHE_READ_PRICE = 0.1
"""A prompt token read from the provider's cache, priced relative to an uncached input token (Anthropic: 0.1)."""

CACHE_WRITE_PRICE = 1.25
"""A prompt token written to the provider's cache, relative to an uncached input token (Anthropic: 1.25)."""
