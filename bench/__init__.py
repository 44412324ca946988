"""The context-sidecar benchmark: ``python bench/run.py``; see bench/README.md."""
