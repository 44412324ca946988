"""The host of a shared database: one process holding the DuckDB file, serving every relay on a Unix socket.

Each connection is its own protocol session (a SidecarServer with its own settings, capabilities and
hooks) over one Storage and one set of per-session runtime state. A host is started on demand by a
relay (``context-sidecar host``), detached from it, and exits, with a checkpoint, ``linger`` seconds
after its last connection closed.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import importlib
import logging
import os
import signal
import socket
import struct
import sys
import threading
from pathlib import Path
from typing import Any

from sidecar.config.settings import DEFAULT_MEMORY_LIMIT, Settings, StorageSettings
from sidecar.config.sockets import ShareError, check_owner, database_key
from sidecar.framing import FrameReader
from sidecar.rpc import handshake
from sidecar.rpc.startup import EarlyStart
from sidecar.services.errors import SidecarError
from sidecar.services.state import Sidecar

log = logging.getLogger(__name__)

LINGER_SECONDS = 5.0
"""How long a host stays up after its last connection closed (or, at start, for its first one)."""
DRAIN_SECONDS = 10.0
"""How long requests still running when a connection ends may take to send their replies."""
HANDSHAKE_SECONDS = 5.0
"""How long a connection may take to send its handshake line."""


def peer_uid(sock: socket.socket) -> int:
    """The uid of the process at the other end of a Unix socket (SO_PEERCRED)."""
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return struct.unpack("3i", creds)[1]


class SocketWriter:
    """pygls' writer interface over a non-blocking socket: what the peer does not take yet waits in a buffer."""

    def __init__(self, sock: socket.socket, loop: asyncio.AbstractEventLoop) -> None:
        self.sock, self.loop = sock, loop
        self.pending = bytearray()
        self.closed = False

    def write(self, data: bytes) -> None:
        """Send now what the socket takes; keep the rest for when it is writable."""
        if self.closed:
            return
        if self.pending:
            self.pending += data
            return
        try:
            sent = self.sock.send(data)
        except BlockingIOError:
            sent = 0
        except OSError as error:
            log.info("connection closed while writing: %s", error)
            self.closed = True
            return
        if sent < len(data):
            self.pending += data[sent:]
            self.loop.add_writer(self.sock.fileno(), self._flush)

    def _flush(self) -> None:
        try:
            sent = self.sock.send(self.pending)
        except BlockingIOError:
            return
        except OSError:
            sent, self.closed = len(self.pending), True
        del self.pending[:sent]
        if not self.pending:
            self.loop.remove_writer(self.sock.fileno())

    def finish(self) -> None:
        """Send what waits in the buffer, blocking: the connection is about to close."""
        if self.closed or not self.pending:
            return
        self.loop.remove_writer(self.sock.fileno())
        try:
            self.sock.setblocking(True)
            self.sock.settimeout(DRAIN_SECONDS)
            self.sock.sendall(self.pending)
        except OSError as error:
            log.info("connection closed before its last replies: %s", error)
        self.pending.clear()

    def close(self) -> None:
        """Stop writing (the connection is ending)."""
        if self.pending and not self.closed:
            self.loop.remove_writer(self.sock.fileno())
        self.closed = True


class Host:
    """One database, served to every connection on its socket."""

    def __init__(self, db: str, socket_file: Path, linger: float = LINGER_SECONDS,
                 memory_limit: str = DEFAULT_MEMORY_LIMIT) -> None:
        self.db = database_key(db)
        self.socket_file = socket_file
        self.linger = linger
        self.sidecar = Sidecar(settings=Settings(storage=StorageSettings(path=self.db, memory_limit=memory_limit)),
                               storage_path=self.db)
        self.servers: set[Any] = set()
        self._listener: socket.socket | None = None
        self._inode: int | None = None
        self._idle: asyncio.TimerHandle | None = None
        self._done: asyncio.Future[None] | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._frozen = False
        from sidecar.rpc.watching import host_watcher

        self.transcripts = host_watcher(self)
        """Follows the agent transcripts of the workspaces its connections watch (memory/watch)."""

    def open(self) -> None:
        """Open the database (ShareError or SidecarError when it cannot be)."""
        check_owner(self.db)
        self.sidecar.store()

    def listen(self) -> None:
        """Bind the socket, replacing a stale file (the caller holds the start-up lock), 0600 from the start."""
        with contextlib.suppress(FileNotFoundError):
            self.socket_file.unlink()
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old = os.umask(0o177)
        try:
            listener.bind(str(self.socket_file))
        finally:
            os.umask(old)
        os.chmod(self.socket_file, 0o600)
        listener.listen(64)
        listener.setblocking(False)
        self._listener = listener
        self._inode = self.socket_file.stat().st_ino

    async def run(self) -> None:
        """Accept connections until the host has been idle for ``linger`` seconds, then checkpoint and close."""
        loop = asyncio.get_running_loop()
        self._done = loop.create_future()
        assert self._listener is not None
        loop.add_reader(self._listener.fileno(), self._accept)
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.stop)
        self._idle_soon()
        try:
            await self._done
        finally:
            loop.remove_reader(self._listener.fileno())
            self._close_listener()
            await self.transcripts.close()
            for task in list(self._tasks):
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)
            gc.unfreeze()  # let the last collection see DuckDB's objects, or its bindings report them as leaked
            self.sidecar.close()
            log.info("host of %s closed", self.db)

    def stop(self) -> None:
        """End ``run``."""
        if self._done is not None and not self._done.done():
            self._done.set_result(None)

    def _close_listener(self) -> None:
        if self._listener is None:
            return
        self._listener.close()
        self._listener = None
        with contextlib.suppress(OSError):
            if self.socket_file.stat().st_ino == self._inode:  # a successor may have bound the name already
                self.socket_file.unlink()

    def _idle_soon(self) -> None:
        if self._idle is not None:
            self._idle.cancel()
        self._idle = asyncio.get_running_loop().call_later(self.linger, self._idle_check)

    def _idle_check(self) -> None:
        if not self.servers:
            log.info("no connection for %.1f s: closing", self.linger)
            self.stop()

    def _accept(self) -> None:
        assert self._listener is not None
        try:
            sock, _ = self._listener.accept()
        except (BlockingIOError, InterruptedError):
            return
        if self._idle is not None:
            self._idle.cancel()
            self._idle = None
        self.keep(asyncio.get_running_loop().create_task(self._connection(sock)))

    def keep(self, task: asyncio.Task[Any]) -> None:
        """Keep a task until it ends; the host cancels those still running when it closes."""
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _connection(self, sock: socket.socket) -> None:
        sock.setblocking(False)
        server = None
        try:
            uid = peer_uid(sock)
            if uid != os.getuid():
                log.warning("refused a connection from uid %d", uid)
                await self._refuse(sock, f"this host serves uid {os.getuid()} only; uid {uid} may not connect")
                return
            peer, rest = await self._handshake(sock)
            if peer is None:
                return
            server = self._server(peer)
            self.servers.add(server)
            await asyncio.get_running_loop().sock_sendall(sock, handshake.hello("host", pid=os.getpid()))
            reader = FrameReader()
            reader.feed(rest)
            writer = SocketWriter(sock, asyncio.get_running_loop())
            await server.serve_fd(sock.fileno(), writer, EarlyStart(reader, reader.frames()))
            await self._answer_pending(server)
            writer.finish()
        except Exception:
            log.exception("connection failed")
        finally:
            if server is not None:
                await self._drop(server)
            sock.close()
            if not self.servers and self._done is not None and not self._done.done():
                self._idle_soon()

    async def _handshake(self, sock: socket.socket) -> tuple[dict[str, Any] | None, bytes]:
        """The relay's handshake and the bytes after it; None (after a refusal, if one is due) when unusable."""
        loop = asyncio.get_running_loop()
        data = b""
        try:
            async with asyncio.timeout(HANDSHAKE_SECONDS):
                while b"\n" not in data and len(data) < handshake.MAX_LINE:
                    chunk = await loop.sock_recv(sock, 4096)
                    if not chunk:
                        return None, b""
                    data += chunk
        except TimeoutError:
            log.warning("a connection sent no handshake")
            return None, b""
        line, _, rest = data.partition(b"\n")
        peer = handshake.parse(line, "relay")
        if peer is None:
            await self._refuse(sock, "expected a context-sidecar relay handshake line")
            return None, b""
        problem = handshake.mismatch(peer)
        if problem is not None:
            log.warning("refused a relay: %s", problem)
            await self._refuse(sock, problem)
            return None, b""
        return peer, rest

    async def _refuse(self, sock: socket.socket, reason: str) -> None:
        with contextlib.suppress(OSError):
            await asyncio.get_running_loop().sock_sendall(sock, handshake.hello("host", error=reason))

    def _server(self, peer: dict[str, Any]) -> Any:
        from sidecar.rpc.handlers import setup
        from sidecar.rpc.server import SidecarServer

        server = SidecarServer(self.sidecar.attached())
        server.hub = self
        server.peer_cwd = peer.get("cwd") if isinstance(peer.get("cwd"), str) else None
        server.sidecar.cwd = server.peer_cwd
        setup(server)
        if not self._frozen:
            # As serve() does: what start-up built lives as long as the process, out of the collector's walks.
            gc.freeze()
            self._frozen = True
        return server

    @staticmethod
    async def _answer_pending(server: Any) -> None:
        """Let requests read before ``exit`` or end of input send their replies, as a process of its own does."""
        pending = list(server.protocol.pending_requests())
        if pending:
            await asyncio.wait(pending, timeout=DRAIN_SECONDS)
        for _ in range(2):
            await asyncio.sleep(0)  # replies go out from the futures' done-callbacks

    def watchers(self, origin: Any, session_id: str) -> list[Any]:
        """The other connections following a session: they worked on it, or follow it or its workspace."""
        store = self.sidecar.open_store
        session = store.session(session_id) if store is not None else None
        workspace = session.workspace if session is not None else None
        return [server for server in self.servers if server is not origin and server.follows(session_id, workspace)]

    async def _drop(self, server: Any) -> None:
        """A connection ended: its background work stops, and it follows and watches nothing any more."""
        self.servers.discard(server)
        self.transcripts.drop(server)
        for task in list(server.background_tasks):
            task.cancel()
        await asyncio.gather(*server.background_tasks, return_exceptions=True)
        if server.compactions is not None:
            with contextlib.suppress(Exception):
                await server.compactions.close()


def main(db: str, socket_file: str, linger: float, memory_limit: str) -> int:
    """``context-sidecar host``: open the database, bind, say "ready" on stdout (or why not), serve."""
    host = Host(db, Path(socket_file), linger, memory_limit)
    # pygls loads while DuckDB opens the file (and replays its WAL): relays waiting on a new host wait less.
    threading.Thread(target=importlib.import_module, args=("sidecar.rpc.handlers",), daemon=True).start()
    try:
        host.open()
        host.listen()
    except (ShareError, SidecarError, OSError) as error:
        message = getattr(error, "message", None) or str(error)
        code = getattr(error, "code", 0)
        sys.stdout.write(f"error {code} {message}\n")
        sys.stdout.flush()
        return 1
    sys.stdout.write(f"ready {os.getpid()}\n")
    sys.stdout.flush()
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)  # the relay that started us stops reading; nothing else may go there
    os.close(devnull)
    asyncio.run(host.run())
    return 0
