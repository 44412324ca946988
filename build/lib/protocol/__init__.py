"""The context-sidecar wire protocol: types, method names and error codes. Data only."""

from protocol import errors, methods, types

__all__ = ["errors", "methods", "types"]
