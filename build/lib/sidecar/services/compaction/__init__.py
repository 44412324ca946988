"""Compaction: planning passes, running summarizers, applying the results atomically."""
