"""context-sidecar: lossless context management for LLM coding tools, over JSON-RPC on stdio."""

__version__ = "0.1.0"
