"""initialize, initialized, shutdown, and settings changes."""

from __future__ import annotations

import asyncio
import importlib
import logging
import os
from typing import Any

from lsprotocol import types as lsp

from protocol import methods
from sidecar.config.database import shown
from sidecar.config.paths import workspace_key, workspace_path
from sidecar.config.settings import read_settings, summarizer_name
from sidecar.rpc.server import SidecarServer
from sidecar.services.errors import SidecarError

log = logging.getLogger(__name__)


def setup(server: SidecarServer) -> None:
    """Register the lifecycle handlers."""

    @server.feature(lsp.INITIALIZE)
    def initialize(ls: SidecarServer, params: lsp.InitializeParams) -> None:
        apply_settings(ls, params.initialization_options)
        experimental = params.capabilities.experimental
        wanted = experimental.get(methods.EXPERIMENTAL_KEY) if isinstance(experimental, dict) else None
        if isinstance(wanted, dict):
            ls.sidecar.usage_notifications = wanted.get("usageNotifications", True) is not False
            ls.sidecar.compaction_hooks = wanted.get("compactionHooks", False) is True
            ls.sidecar.client_summaries = wanted.get("summaries", False) is True
        root = workspace_root(params)
        ls.sidecar.workspace = workspace_key(root or ls.peer_cwd or os.getcwd())
        path = ls.sidecar.resolve_storage_path(root)
        ls.sidecar.merge_root = root  # before any request uses the store
        # Opened just after the reply: importing DuckDB and opening the file need not delay initialize.
        asyncio.get_running_loop().call_later(OPEN_DELAY, open_store, ls)
        log.info("initialized with storage %s", shown(path))
        ls.initialized = True
        if summarizer_name(ls.sidecar.settings) == "openai":
            # openai takes ~300 ms to import; done now, in a thread, the first compaction does not stall requests.
            asyncio.get_running_loop().run_in_executor(None, importlib.import_module, "openai")

    @server.feature(lsp.SHUTDOWN)
    async def shutdown(ls: SidecarServer, *args: Any) -> None:
        for task in list(ls.background_tasks):
            task.cancel()
        await asyncio.gather(*ls.background_tasks, return_exceptions=True)
        if ls.compactions is not None:
            await ls.compactions.close()
        ls.sidecar.close()

    @server.feature(lsp.WORKSPACE_DID_CHANGE_CONFIGURATION)
    async def did_change_configuration(ls: SidecarServer, params: lsp.DidChangeConfigurationParams) -> None:
        data = params.settings
        if isinstance(data, dict) and methods.SETTINGS_SECTION in data:
            data = data[methods.SETTINGS_SECTION]
        if data is None:
            workspace = ls.client_capabilities.workspace
            if not (workspace and workspace.configuration):
                log.warning("settings are null but the client cannot answer workspace/configuration; keeping them")
                return
            pulled = await ls.protocol.send_request_async(
                lsp.WORKSPACE_CONFIGURATION,
                lsp.ConfigurationParams(items=[lsp.ConfigurationItem(section=methods.SETTINGS_SECTION)]),
            )
            data = pulled[0] if pulled else None
        apply_settings(ls, data)
        store = ls.sidecar.store()
        sessions = [session for session in map(store.session, ls.touched_sessions) if session is not None]
        # Least recently updated first: a client following the latest session ends on it.
        for session in sorted(sessions, key=lambda session: (session.updated_at, session.session_id)):
            ls.push_usage(ls.sidecar.usage(session))


OPEN_DELAY = 0.05
"""Seconds after initialize at which the store is opened, so that the initialize reply goes first."""


def open_store(ls: SidecarServer) -> None:
    """Open the store now (merging a workspace's file of earlier versions); a lock held elsewhere is shown."""
    if ls.shutdown_requested or ls.ended:  # exit can come in the same read as initialize: the store stays shut
        return
    try:
        ls.sidecar.store()
    except SidecarError as error:
        log.warning("%s", error.message)
        ls.show_message(f"context-sidecar: {error.message}", lsp.MessageType.Error)


def apply_settings(ls: SidecarServer, data: Any) -> None:
    """Take client settings; report wrong-typed ones and keep their defaults."""
    settings, problems = read_settings(data)
    if ls.sidecar.storage_path and settings.storage.path not in (None, ls.sidecar.storage_path):
        problems.append("storage.path: a new path takes effect when the sidecar restarts")
    previous, ls.sidecar.settings = ls.sidecar.settings, settings
    ls.sidecar.runtime.reconsider(previous)  # back-offs and idle marks it judged; other connections' stay
    if problems:
        text = "context-sidecar settings: " + "; ".join(problems)
        log.warning("%s", text)
        ls.show_message(text)


def workspace_root(params: lsp.InitializeParams) -> str | None:
    """The client's workspace folder, as a path."""
    folder = params.workspace_folders[0].uri if params.workspace_folders else None
    return workspace_path(params.root_uri, folder, params.root_path)
