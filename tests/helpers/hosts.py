"""Shared databases' hosts in tests: a short runtime directory of a test's own, and the hosts left in it stopped."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import socket
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from unittest.mock import patch

from sidecar.config.sockets import socket_path
from sidecar.rpc import handshake

WAIT = 30.0


def host_hello(sock_file: Path, **extra: Any) -> dict[str, Any]:
    """Connect as a relay would and return the host's handshake."""
    with socket.socket(socket.AF_UNIX) as sock:
        sock.settimeout(WAIT)
        sock.connect(str(sock_file))
        sock.sendall(handshake.hello("relay", **extra) if not extra.get("raw") else extra["raw"])
        line = sock.makefile("rb").readline()
    return json.loads(line)


def host_pid(sock_file: Path) -> int:
    return int(host_hello(sock_file)["pid"])


@contextlib.contextmanager
def short_runtime() -> Iterator[Path]:
    """A short XDG_RUNTIME_DIR (socket paths are limited to 108 bytes); its hosts are killed at the end."""
    path = Path(tempfile.mkdtemp(prefix="cs-"))
    try:
        yield path
    finally:
        for sock in path.glob("context-sidecar/*.sock"):
            with contextlib.suppress(Exception):
                os.kill(host_pid(sock), signal.SIGKILL)
        shutil.rmtree(path, ignore_errors=True)


def sock_of(runtime: Path, db: Path) -> Path:
    """The socket of ``db``'s host under the runtime directory ``runtime``."""
    with patch.dict(os.environ, {"XDG_RUNTIME_DIR": str(runtime)}):
        return socket_path(str(db))


async def until(predicate: Callable[[], bool], what: str) -> None:
    """Wait for ``what``, a condition another process brings about (a host leaving, a request reaching a fake)."""
    async with asyncio.timeout(WAIT):
        while not predicate():
            await asyncio.sleep(0.02)


async def until_logged(log: Path, text: str) -> None:
    """Wait for the host to log ``text`` (another process's doing)."""
    async with asyncio.timeout(WAIT):
        while not log.exists() or text not in log.read_text():
            await asyncio.sleep(0.05)
