"""The host of a shared database: one process holding the DuckDB file, serving every relay on a Unix socket.

Each connection is its own protocol session (a SidecarServer with its own settings, capabilities and
hooks) over one Storage and one set of per-session runtime state. A host is started on demand by a
relay (``context-sidecar host``), detached from it, and exits, with a checkpoint, ``linger`` seconds
after its last connection closed.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import fcntl
import gc
import importlib
import itertools
import logging
import os
import signal
import socket
import struct
import sys
import threading
from pathlib import Path
from typing import Any

from sidecar.config.database import PasswordMask
from sidecar.config.settings import DEFAULT_MEMORY_LIMIT, Settings, StorageSettings
from sidecar.config.sockets import ShareError, check_owner, database_key, lock_path
from sidecar.framing import FrameReader
from sidecar.rpc import handshake
from sidecar.rpc.startup import EarlyStart
from sidecar.services.errors import SidecarError
from sidecar.services.state import Sidecar

log = logging.getLogger(__name__)

LINGER_SECONDS = 5.0
"""How long a host stays up after its last connection closed (or, at start, for its first one)."""
DRAIN_SECONDS = 10.0
"""How long the replies of a connection that is ending may take to be written."""
FINISH_SECONDS = 600.0
"""How long requests of a connection that ended may run on (a compaction waiting on its summarizer) before they
are cancelled, which leaves their sessions as they were."""
CONNECTION: contextvars.ContextVar[int | None] = contextvars.ContextVar("connection", default=None)
"""The host's number of the connection whose work is running: its log records also go to its client's log."""
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


class ConnectionLog(logging.Filter):
    """The records of one connection, for the log file its relay was given (``--log-file``)."""

    def __init__(self, number: int) -> None:
        super().__init__()
        self.number = number

    def filter(self, record: logging.LogRecord) -> bool:
        return CONNECTION.get() == self.number

    @staticmethod
    def handler(number: int, peer: dict[str, Any]) -> logging.Handler | None:
        """A handler writing this connection's records to the relay's log file, at its verbosity; None if none."""
        path, verbose = peer.get("logFile"), peer.get("verbose", 0)
        if not isinstance(path, str) or not path or not isinstance(verbose, int):
            return None
        try:
            handler = logging.FileHandler(path)
        except OSError as error:
            log.warning("cannot write connection %d's log to %s: %s", number, path, error)
            return None
        handler.setLevel(logging.WARNING - 10 * max(0, min(verbose, 2)))
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s [host]: %(message)s"))
        handler.addFilter(ConnectionLog(number))
        handler.addFilter(PasswordMask())
        root = logging.getLogger()
        if handler.level < root.getEffectiveLevel():
            for own in root.handlers:  # the host's own log keeps its level
                if own.level == logging.NOTSET:
                    own.setLevel(root.getEffectiveLevel())
            root.setLevel(handler.level)
        root.addHandler(handler)
        return handler


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
        self._numbers = itertools.count(1)
        self.leaving: set[Any] = set()
        self.drivers: dict[str, Any] = {}
        """Per session, the connection that declared ``summaries`` and stored its messages last: it runs the
        session's summary calls."""
        """Connections whose client has gone while their requests finish: told of no other session's changes."""
        self.errors = 0
        """Records of ERROR or worse logged: a host that logged none removes its log file when it exits."""
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
        store = self.sidecar.open_store
        if store is not None:  # a team database's other hosts write too: their changes reach our followers
            def heard(session_id: str | None) -> None:
                loop.call_soon_threadsafe(self.changed_elsewhere, session_id)

            store.listen(heard)
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
            self._tidy()

    def _tidy(self) -> None:
        """Remove the lock file, and the log unless an error is in it, unless a relay is starting a new host."""
        lock = lock_path(self.socket_file)
        try:
            fd = os.open(lock, os.O_WRONLY)
        except OSError:
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            return  # a relay holds it: it is starting the next host, which appends to the same log
        try:
            if not self.errors:
                with contextlib.suppress(OSError):
                    self.socket_file.with_suffix(".log").unlink()
            # Unlinked while locked: a relay waiting for this lock sees that its file is gone and opens it anew.
            with contextlib.suppress(OSError):
                lock.unlink()
        finally:
            os.close(fd)

    def _stopping(self) -> bool:
        return self._done is None or self._done.done()

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
        number = next(self._numbers)
        CONNECTION.set(number)  # this task's context: what it starts logs as this connection
        server = None
        handler = None
        try:
            uid = peer_uid(sock)
            if uid != os.getuid():
                log.warning("refused a connection from uid %d", uid)
                await self._refuse(sock, f"this host serves uid {os.getuid()} only; uid {uid} may not connect")
                return
            peer, rest = await self._handshake(sock)
            if peer is None:
                return
            # Answered before the server is built: the first one waits for the handlers' import (pygls), which
            # took over the relay's HANDSHAKE_WAIT on a loaded machine, and the relay judged this no host.
            await asyncio.get_running_loop().sock_sendall(sock, handshake.hello("host", pid=os.getpid()))
            handler = ConnectionLog.handler(number, peer)
            server = self._server(peer)
            self.servers.add(server)
            log.info("connection %d: relay pid %s in %s", number, peer.get("pid"), peer.get("cwd"))
            reader = FrameReader()
            reader.feed(rest)
            writer = SocketWriter(sock, asyncio.get_running_loop())
            await server.serve_fd(sock.fileno(), writer, EarlyStart(reader, reader.frames()))
            self.leaving.add(server)
            await self._finish(server)
            writer.finish()
        except Exception:
            log.exception("connection %d failed", number)
        finally:
            if server is not None:
                await self._drop(server)
            sock.close()
            if handler is not None:
                logging.getLogger().removeHandler(handler)
                handler.close()
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
    async def _finish(server: Any) -> None:
        """The client said ``exit`` or is gone: what it asked for runs to its end and is answered if it can be.

        Requests the server sent it are answered with an error at once (nobody else will), so a compaction
        waiting on its ``context/willCompact`` proceeds. The client's requests, a compaction waiting on its
        summarizer among them, finish for their sessions, or are cancelled after FINISH_SECONDS, which leaves
        their sessions as they were.
        """
        abandoned = server.protocol.abandon_outgoing("the client is gone")
        running = server.protocol.handling()
        if abandoned or running:
            log.info("client gone with %d requests running and %d of ours unanswered", len(running), abandoned)
        await server.finish_requests(FINISH_SECONDS)

    def changed_elsewhere(self, session_id: str | None) -> None:
        """Another host changed a session (None: any may have changed): its followers here get its usage."""
        store = self.sidecar.open_store
        if store is None:
            return
        wanted = [session_id] if session_id is not None else sorted(
            {sid for server in self.servers for sid in server.touched_sessions | server.following_sessions})
        for sid in wanted:
            try:
                session = store.session(sid)
            except Exception as error:  # the server may be gone again; the next notification tries anew
                log.info("reading %s after another host's change: %s", sid, error)
                return
            if session is None:
                continue
            usage = self.sidecar.usage(session)
            for server in self.watchers(None, sid):
                server.push_usage(usage)

    def watchers(self, origin: Any, session_id: str) -> list[Any]:
        """The other connections following a session: they worked on it, or follow it or its workspace."""
        store = self.sidecar.open_store
        session = store.session(session_id) if store is not None else None
        workspace = session.workspace if session is not None else None
        return [server for server in self.servers
                if server is not origin and server not in self.leaving and server.follows(session_id, workspace)]

    async def _drop(self, server: Any) -> None:
        """A connection ended: what still runs of its work is cancelled (a stopping host); it follows and watches
        nothing any more."""
        self.transcripts.drop(server)
        for session_id in [key for key, driver in self.drivers.items() if driver is server]:
            del self.drivers[session_id]
        for future in server.protocol.handling():
            future.cancel()
        # Its automatic compactions finish for their sessions, as its requests do (a stopping host cancels them);
        # those begun ahead of a threshold the session will not reach without this client apply their summaries.
        if server.compactions is not None:
            server.compactions.land_all_ahead()
        if server.background_tasks and not self._stopping():
            await asyncio.wait(list(server.background_tasks), timeout=FINISH_SECONDS)
        for task in list(server.background_tasks):
            task.cancel()
        await asyncio.gather(*server.background_tasks, *server.protocol.handling(), return_exceptions=True)
        self.servers.discard(server)
        self.leaving.discard(server)
        if server.compactions is not None:
            with contextlib.suppress(Exception):
                await server.compactions.close()


class _ErrorCount(logging.Handler):
    """Counts the host's records of ERROR and worse."""

    def __init__(self, host: Host) -> None:
        super().__init__(logging.ERROR)
        self.host = host

    def emit(self, record: logging.LogRecord) -> None:
        self.host.errors += 1


def main(db: str, socket_file: str, linger: float, memory_limit: str) -> int:
    """``context-sidecar host``: open the database, bind, say "ready" on stdout (or why not), serve."""
    host = Host(db, Path(socket_file), linger, memory_limit)
    logging.getLogger().addHandler(_ErrorCount(host))
    # pygls loads while DuckDB opens the file (and replays its WAL): relays waiting on a new host wait less.
    importing = threading.Thread(target=importlib.import_module, args=("sidecar.rpc.handlers",), daemon=True)
    importing.start()
    try:
        host.open()
        host.listen()
    except (ShareError, SidecarError, OSError) as error:
        message = getattr(error, "message", None) or str(error)
        _tell_starter(f"error {getattr(error, 'code', 0)} {message}")
        return 1
    # Ready once it can answer a handshake at once: a connection's server needs those modules, and on a loaded
    # machine their import outlasted the relay's HANDSHAKE_WAIT, which took the new host for no host at all.
    importing.join()
    # Its starter may be gone (a client killed as it started): other relays may be waiting for this host all the
    # same, and if none comes it leaves, tidily, after ``linger``.
    _tell_starter(f"ready {os.getpid()}")
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)  # the relay that started us stops reading; nothing else may go there
    os.close(devnull)
    asyncio.run(host.run())
    return 0


def _tell_starter(line: str) -> None:
    """Write the line the relay that started this host waits for, if it still reads."""
    try:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()
    except OSError:
        log.info("the relay that started this host is gone before it said: %s", line)
