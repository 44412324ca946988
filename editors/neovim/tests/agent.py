"""A terminal agent for the Neovim tests: the Python client on a database, driven by JSON lines.

    python agent.py DB COMMAND...

Spawns COMMAND (a context-sidecar) with ``--db DB`` through ``SidecarClient.spawn``, in this process's
working directory, which the sidecar records as the workspace of the sessions it creates (the client
names no root, as agents do). Prints ``{"ready": true}``, then answers each stdin line
``{"method", "params"}`` with a line ``{"result": ...}`` or ``{"error": {"code", "message"}}``.
End of input closes the client.
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

from sidecar.client import SidecarClient, SidecarRequestError


def say(line: dict[str, Any]) -> None:
    """One JSON line on stdout."""
    sys.stdout.write(json.dumps(line) + "\n")
    sys.stdout.flush()


async def main(db: str, command: list[str]) -> None:
    """Serve stdin's requests through one client."""
    settings = {"contextWindow": 4000, "compaction": {"auto": False, "maxTokens": -1, "reserveTokens": 500}}
    client = await SidecarClient.spawn(command, db=db, settings=settings)
    say({"ready": True})
    loop = asyncio.get_running_loop()
    try:
        while line := await loop.run_in_executor(None, sys.stdin.readline):
            request = json.loads(line)
            try:
                say({"result": await client.request(request["method"], request.get("params"))})
            except SidecarRequestError as error:
                say({"error": {"code": error.code, "message": error.message}})
    finally:
        await client.close()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2:]))
