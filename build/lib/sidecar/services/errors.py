"""Errors a request can end with, each carrying its JSON-RPC code."""

from __future__ import annotations

from typing import Any

from protocol import errors as codes


class SidecarError(Exception):
    """A request failed in a way the client should be told about, with a protocol error code."""

    def __init__(self, code: int, message: str, data: Any | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.data = data


def invalid_params(message: str, field: str | None = None) -> SidecarError:
    """-32602, naming the field when known."""
    return SidecarError(codes.INVALID_PARAMS, message, {"field": field} if field else None)


def unknown_session(session_id: str) -> SidecarError:
    """-32001."""
    return SidecarError(codes.UNKNOWN_SESSION, f"unknown session {session_id!r}", {"sessionId": session_id})


def id_not_found(session_id: str, item_id: str) -> SidecarError:
    """-32004; says nothing of other sessions."""
    return SidecarError(codes.ID_NOT_FOUND, f"no message or summary {item_id!r} in session {session_id!r}",
                        {"id": item_id})
