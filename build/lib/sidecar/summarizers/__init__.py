"""Summarizers: the OpenAI-compatible one and the deterministic fallback."""
