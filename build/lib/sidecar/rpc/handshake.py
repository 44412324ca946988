"""The line a relay and a host exchange before any LSP bytes: who they are, and which versions they speak."""

from __future__ import annotations

import json
from typing import Any

from protocol import methods
from sidecar import __version__

PROGRAM = "context-sidecar"
MAX_LINE = 4096


def hello(role: str, **extra: Any) -> bytes:
    """This process's handshake line, as ``role`` ("relay" or "host")."""
    line = {"program": PROGRAM, "role": role, "version": __version__, "protocol": methods.PROTOCOL_VERSION, **extra}
    return json.dumps(line, separators=(",", ":")).encode() + b"\n"


def parse(line: bytes, role: str) -> dict[str, Any] | None:
    """The peer's handshake, if ``line`` is one from a ``role``; None for anything else."""
    try:
        data = json.loads(line)
    except ValueError:
        return None
    if not isinstance(data, dict) or data.get("program") != PROGRAM or data.get("role") != role:
        return None
    return data


def mismatch(peer: dict[str, Any]) -> str | None:
    """Why a peer of other versions is refused, naming both; None when they agree."""
    ours = (__version__, methods.PROTOCOL_VERSION)
    theirs = (peer.get("version"), peer.get("protocol"))
    if ours == theirs:
        return None
    return (f"{peer.get('role')} speaks context-sidecar {theirs[0]} (protocol {theirs[1]}) but this "
            f"{'host' if peer.get('role') == 'relay' else 'relay'} is context-sidecar {ours[0]} (protocol {ours[1]})")
