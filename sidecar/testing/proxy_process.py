"""``context-sidecar proxy`` in a process of its own, as users run it, for tests and benchmarks."""

from __future__ import annotations

import asyncio
import contextlib
import re
import signal
import sys
from collections.abc import AsyncIterator, Mapping, Sequence

LISTENING = re.compile(rb"listening on (http://127\.0\.0\.1:\d+)")


@contextlib.asynccontextmanager
async def proxy_process(args: Sequence[str], env: Mapping[str, str] | None = None,
                        timeout: float = 60.0) -> AsyncIterator[tuple[str, asyncio.subprocess.Process]]:
    """``context-sidecar proxy --port 0 ARGS…``: its URL once it listens, and the process; stopped with SIGINT."""
    argv = [sys.executable, "-P", "-m", "sidecar", "proxy", "--port", "0", *args]
    process = await asyncio.create_subprocess_exec(*argv, stderr=asyncio.subprocess.PIPE,
                                                   env=dict(env) if env is not None else None)
    assert process.stderr is not None
    try:
        line = await asyncio.wait_for(process.stderr.readline(), timeout)
        found = LISTENING.search(line)
        if found is None:
            raise RuntimeError(f"the proxy did not start: {line!r} {await process.stderr.read()!r}")
        yield found.group(1).decode(), process
    finally:
        if process.returncode is None:
            process.send_signal(signal.SIGINT)
            try:
                await asyncio.wait_for(process.wait(), 30)
            except TimeoutError:
                process.kill()
                await process.wait()
