"""Defaults needed before the settings classes load (the command line reads them at every start)."""

DEFAULT_MEMORY_LIMIT = "512MB"
"""DuckDB's ``memory_limit`` unless ``storage.memoryLimit`` says otherwise."""
