"""Answering ``initialize`` while pygls loads.

Importing pygls costs most of a start-up (lsprotocol builds about 600 attrs classes), and an editor
waits on the initialize reply before it activates. So the process reads the first message itself
while a thread imports the server, answers a well-formed initialize from the same settings and path
functions the server uses, and the server then adopts that request without answering it again.
Messages that follow wait in the pipe until the server is ready.
"""

from __future__ import annotations

import importlib
import os
import select
import threading
from typing import Any, BinaryIO

import attrs

from protocol import methods
from sidecar import __version__
from sidecar.config.database import shown
from sidecar.config.paths import default_database, workspace_path
from sidecar.config.settings import Settings, read_settings, summarizer_name
from sidecar.framing import Frame, FrameReader, encode

FIRST_MESSAGE_WAIT = 0.5
"""Seconds to wait for the first message before leaving it to the server."""
PRELOAD = ("sidecar.rpc.handlers", "sidecar.storage.database")
"""Imported in the background at start: the server (pygls), then DuckDB, which the store opens just after."""
_ENCODINGS = ("utf-8", "utf-16", "utf-32")
_CAPABILITY_SECTIONS = ("workspace", "textDocument", "notebookDocument", "window", "general")
_OPTIONAL_STRINGS = ("rootUri", "rootPath", "locale", "trace")


@attrs.define
class EarlyStart:
    """What was read and answered before the server existed."""

    reader: FrameReader
    frames: list[Frame]
    answered: dict[str, Any] | None = None
    """The initialize result sent for ``frames[0]``, when it was answered early."""
    raw: bytearray = attrs.field(factory=bytearray)
    """Every byte read, as read: a relay forwards them to the host."""


def start(stdin_fd: int, stdout: BinaryIO, storage_path: str | None) -> EarlyStart:
    """Import the server in a thread; meanwhile read the first message and answer it if it is initialize."""
    preload()
    return answer(read_first(stdin_fd, FIRST_MESSAGE_WAIT), stdout, storage_path)


def preload() -> None:
    """Import the server and DuckDB in a background thread."""
    threading.Thread(target=_preload, daemon=True, name="import-server").start()


def read_first(stdin_fd: int, wait: float | None) -> EarlyStart:
    """Read until the first message is complete, end of input, or ``wait`` seconds without bytes."""
    early = EarlyStart(FrameReader(), [])
    if os.name == "nt":  # select() does not take pipes there
        return early
    while not early.frames:
        ready, _, _ = select.select([stdin_fd], [], [], wait)
        data = os.read(stdin_fd, 1 << 16) if ready else b""
        if not data:
            return early  # end of input, or a slow client: the server reads on
        early.raw += data
        early.reader.feed(data)
        early.frames = early.reader.frames()
    return early


def answer(early: EarlyStart, stdout: BinaryIO, storage_path: str | None) -> EarlyStart:
    """Answer the first message now if it is a plain initialize."""
    if not early.frames:
        return early
    message = early.frames[0].message
    if not _plain_initialize(message):
        return early
    try:
        result = initialize_result(message["params"], storage_path)
        reply = encode({"jsonrpc": "2.0", "id": message["id"], "result": result})
    except Exception:  # e.g. a lone surrogate in a path, or a URI urlparse rejects: the server answers those
        return early
    stdout.write(reply)
    stdout.flush()
    early.answered = result
    return early


def _preload() -> None:
    for module in PRELOAD:
        importlib.import_module(module)


def _settings_and_storage(params: dict[str, Any], storage_path: str | None) -> tuple[Settings, str]:
    """The settings an initialize's params give, and the database it names (``--db`` first), as the server reads
    them."""
    settings, _ = read_settings(params.get("initializationOptions"))
    folders = params.get("workspaceFolders") or []
    root = workspace_path(params.get("rootUri"), folders[0]["uri"] if folders else None, params.get("rootPath"))
    return settings, storage_path or settings.storage.path or default_database(root)


def initialize_result(params: dict[str, Any], storage_path: str | None) -> dict[str, Any]:
    """The initialize result the server gives for these params (its adoption checks that it agrees)."""
    settings, storage = _settings_and_storage(params, storage_path)
    general = params["capabilities"].get("general") or {}
    encoding = next((e for e in general.get("positionEncodings") or () if e in _ENCODINGS), "utf-16")
    return {
        "capabilities": {
            "positionEncoding": encoding,
            "executeCommandProvider": {"commands": []},
            "workspace": {"workspaceFolders": {"supported": True, "changeNotifications": True},
                          "fileOperations": {}},
            "experimental": {methods.EXPERIMENTAL_KEY: sidecar_capabilities(
                list(methods.REQUESTS), summarizer_name(settings), storage)},
        },
        "serverInfo": {"name": methods.SERVER_NAME, "version": __version__},
    }


def sidecar_capabilities(served: list[str], summarizer: str, storage: str) -> dict[str, Any]:
    """``capabilities.experimental.contextSidecar`` of the initialize result (the server's and the early one)."""
    return {"protocolVersion": methods.PROTOCOL_VERSION, "methods": served,
            "compactionModes": list(methods.COMPACTION_MODES), "summarizer": summarizer, "storage": shown(storage),
            "clientSummaries": True}


def storage_of(message: Any, storage_path: str | None) -> tuple[str, str, bool] | None:
    """(database path, memoryLimit, share) that the first message asks for; None if it is no plain initialize."""
    if not _plain_initialize(message):
        return None
    try:
        settings, path = _settings_and_storage(message["params"], storage_path)
    except Exception:  # the server answers what is wrong with it
        return None
    return path, settings.storage.memory_limit, settings.storage.share


def _plain_initialize(message: Any) -> bool:
    """An initialize request whose params have the usual shape; anything unusual is left to the server."""
    if not (isinstance(message, dict) and message.get("jsonrpc") == "2.0" and message.get("method") == "initialize"):
        return False
    msg_id = message.get("id")
    if isinstance(msg_id, bool) or not isinstance(msg_id, (int, str)):
        return False
    params = message.get("params")
    if not isinstance(params, dict) or not isinstance(params.get("capabilities"), dict):
        return False
    capabilities = params["capabilities"]
    if any(not isinstance(capabilities.get(key, {}), dict) for key in _CAPABILITY_SECTIONS):
        return False
    encodings = (capabilities.get("general") or {}).get("positionEncodings")
    if encodings is not None and not (isinstance(encodings, list) and all(isinstance(e, str) for e in encodings)):
        return False
    if any(params.get(key) is not None and not isinstance(params[key], str) for key in _OPTIONAL_STRINGS):
        return False
    if params.get("trace") not in (None, "off", "messages", "verbose"):
        return False
    client = params.get("clientInfo")
    if client is not None and not (isinstance(client, dict) and isinstance(client.get("name"), str)):
        return False
    process_id = params.get("processId")
    if process_id is not None and (isinstance(process_id, bool) or not isinstance(process_id, int)):
        return False
    folders = params.get("workspaceFolders")
    return folders is None or (isinstance(folders, list) and all(
        isinstance(f, dict) and isinstance(f.get("uri"), str) and isinstance(f.get("name"), str) for f in folders))
