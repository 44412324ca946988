"""A relay: the ``context-sidecar`` a client spawned, passing its stdio to the database's host, byte for byte.

The relay reads what it forwards only to know which requests are in flight (answered -32022, retryable,
when the host dies) and which messages open the client's protocol session (initialize, initialized,
settings, follows, watches), replayed to a new host so that the client does not notice the change beyond those
errors. The host is started on demand, under a lock, by whichever relay finds no host listening.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import re
import select
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from protocol import errors as codes
from protocol import methods
from sidecar.config.database import password
from sidecar.config.sockets import ShareError, database_key, lock_path, socket_path
from sidecar.framing import FrameReader, encode, take_frames
from sidecar.rpc import handshake

log = logging.getLogger(__name__)

HOST_LOST = codes.HOST_CONNECTION_LOST
HANDSHAKE_WAIT = 10.0
"""Seconds a relay waits for a host's handshake before it judges that the socket is not a host. A host answers from
its event loop, which a busy machine can hold for seconds (2 s turned busy hosts away as no hosts)."""
HOST_START_WAIT = 60.0
"""Seconds a relay waits for a host it started to open the database (a long WAL may be replayed)."""
RECONNECT_WAIT = 30.0
"""Seconds a relay keeps trying to reach or start a new host after its host died."""
HOST_LEAVING_WAIT = 2.0
"""Seconds a new relay retries starting a host before it opens the database itself (see ``serve``)."""
REPLAYED = ("initialize", "initialized", "workspace/didChangeConfiguration", methods.CONTEXT_FOLLOW,
            methods.MEMORY_WATCH)
_ID = re.compile(rb'"id"\s*:\s*(-?\d+|"(?:[^"\\]|\\.)*")')


class Refused(Exception):
    """The socket cannot be used: not a host, another version, another user; the message names the socket."""


class HostFailed(Exception):
    """A host could not be started (the database is locked by a process that does not share it, say)."""


def connect(path: Path, log_to: dict[str, Any] | None = None) -> socket.socket | None:
    """A handshaken connection to the host at ``path``; None when no host listens there (no file, or stale).

    ``log_to`` (``logFile``, ``verbose``) asks the host to write this connection's log records there too.
    """
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(str(path))
    except (FileNotFoundError, ConnectionRefusedError):
        sock.close()
        return None
    except OSError as error:
        sock.close()
        raise Refused(f"cannot connect to {path}: {error}") from error
    try:
        sock.settimeout(HANDSHAKE_WAIT)
        sock.sendall(handshake.hello("relay", cwd=os.getcwd(), pid=os.getpid(), **(log_to or {})))
        line = b""
        while not line.endswith(b"\n") and len(line) < handshake.MAX_LINE:
            chunk = sock.recv(1)  # one byte at a time: nothing after the line is ours to read yet
            if not chunk:
                break
            line += chunk
    except TimeoutError:
        sock.close()
        raise Refused(f"{path} is not a context-sidecar host: no handshake within {HANDSHAKE_WAIT:g} s") from None
    except (ConnectionResetError, BrokenPipeError):
        sock.close()
        return None  # a host killed a moment ago: its socket still took the connection
    except OSError as error:
        sock.close()
        raise Refused(f"{path} is not a context-sidecar host: {error}") from error
    if not line:
        sock.close()
        return None  # closed without a word: a host that is going away
    peer = handshake.parse(line, "host")
    if peer is None:
        sock.close()
        raise Refused(f"{path} is not a context-sidecar host: it answered {line[:80]!r}")
    if "error" in peer:
        sock.close()
        raise Refused(f"the host at {path} refused this relay: {peer['error']}")
    problem = handshake.mismatch(peer)
    if problem is not None:
        sock.close()
        raise Refused(f"the host at {path} cannot be used: {problem}")
    sock.settimeout(None)
    return sock


def attach(db: str, memory_limit: str, log_args: list[str], log_to: dict[str, Any] | None = None,
           starting: Callable[[], None] | None = None) -> socket.socket:
    """Connect to the database's host, starting one first (under the lock) if none listens; ``starting`` is
    called just before this relay starts one."""
    try:
        path = socket_path(db)
    except ShareError as error:
        raise Refused(str(error)) from error
    sock = connect(path, log_to)
    if sock is not None:
        return sock
    lock = lock_path(path)
    with _start_lock(lock):
        sock = connect(path, log_to)  # whoever held the lock may have started one
        if sock is not None:
            return sock
        if starting is not None:
            starting()
        try:
            start_host(db, path, memory_limit, log_args)
        except HostFailed:
            # Unlinked while locked, as a host that exits does: a relay waiting for the lock opens the file anew.
            with contextlib.suppress(OSError):
                lock.unlink()
            raise
        sock = connect(path, log_to)
    if sock is None:
        raise Refused(f"the host started for {database_key(db)} does not listen on {path}")
    return sock


@contextlib.contextmanager
def _start_lock(path: Path) -> Iterator[None]:
    """Hold the lock on ``path``: a host that exits removes the file while holding it, so a lock taken on a
    file no longer at ``path`` is taken again on the new one."""
    while True:
        with open(path, "a") as lock:
            os.fchmod(lock.fileno(), 0o600)
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
            try:
                current = os.stat(path).st_ino
            except FileNotFoundError:
                current = None
            if current == os.fstat(lock.fileno()).st_ino:
                yield
                return


def start_host(db: str, path: Path, memory_limit: str, log_args: list[str]) -> None:
    """Start ``context-sidecar host`` for ``db``, detached, and wait until it listens on ``path``."""
    log_file = path.with_suffix(".log")
    os.close(os.open(log_file, os.O_WRONLY | os.O_CREAT, 0o600))  # session content may reach -vv logs
    argv = [sys.executable, "-P", "-m", "sidecar", "host", "--db", database_key(db), "--socket", str(path),
            "--memory-limit", memory_limit, "--log-file", str(log_file), *log_args]
    # Its own session and the root directory: it outlives this relay and must pin none of its client's folders;
    # so the package is found where this process found it, not through the working directory.
    package_root = str(Path(__file__).resolve().parents[2])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, (package_root, os.environ.get("PYTHONPATH"))))}
    secret = password(db)
    if secret is not None:  # a URL's password goes to the host as libpq reads it, never on its command line
        env["PGPASSWORD"] = secret
    process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                               start_new_session=True, close_fds=True, cwd="/", env=env)
    assert process.stdout is not None
    ready, _, _ = select.select([process.stdout], [], [], HOST_START_WAIT)
    line = process.stdout.readline().decode(errors="replace").strip() if ready else ""
    process.stdout.close()
    if line.startswith("ready"):
        log.info("started the host of %s (pid %d) on %s", database_key(db), process.pid, path)
        return
    if not ready:
        process.kill()
    process.wait()
    with contextlib.suppress(OSError):
        if log_file.stat().st_size == 0:
            log_file.unlink()  # made for a host that never ran; an earlier host's lines stay
    raise HostFailed(line.removeprefix("error ").strip() or f"the host exited (see {path.with_suffix('.log')})")


def _response_id(frame: bytes) -> Any:
    """The id of a response frame from the host; None for its notifications and requests."""
    body = frame[frame.find(b"\r\n\r\n") + 4:]
    head = body[:256]
    if b'"method"' in head:
        return None
    match = _ID.search(head)
    return json.loads(match.group(1)) if match else None


class Relay:
    """Passes a client's stdio to the host, and survives the host's death."""

    def __init__(self, db: str, memory_limit: str, log_args: list[str], client_pid: int | None = None,
                 log_to: dict[str, Any] | None = None, answered: tuple[Any, Any] | None = None) -> None:
        self.db, self.memory_limit, self.log_args, self.log_to = db, memory_limit, log_args, log_to
        self.answered = answered
        """(id, result) of the initialize this relay answered itself: the host's reply to it is checked, not sent."""
        self.client_pid = client_pid
        self.up = FrameReader()
        self.down = bytearray()
        self.in_flight: dict[Any, str] = {}
        self.opening: dict[str, list[dict[str, Any]]] = {}
        """The messages that open the client's session, replayed to a new host, by method."""
        self.swallow: set[Any] = set()
        self.shutdown = False
        self.exited = False
        self.replays = 0
        self.sock: socket.socket | None = None

    def run(self, first: bytes, sock: socket.socket) -> int:
        """Relay until the client sends ``exit`` or closes its input; returns the exit code."""
        self.sock = sock
        if self.answered is not None:
            self.swallow.add(self.answered[0])
        self._up(first)
        stdin_open = True
        while True:
            watched: list[Any] = [self.sock]
            if stdin_open:
                watched.append(0)
            readable, _, _ = select.select(watched, [], [], 2.0 if self.client_pid else None)
            self._check_client()
            if 0 in readable:
                data = os.read(0, 1 << 16)
                if data:
                    self._up(data)
                else:
                    stdin_open = False
                    with contextlib.suppress(OSError):
                        self.sock.shutdown(socket.SHUT_WR)
            if self.sock in readable:
                try:
                    data = self.sock.recv(1 << 16)
                except OSError:
                    data = b""
                if data:
                    self._down(data)
                elif self.exited or not stdin_open:
                    return 0 if self.shutdown else 1
                else:
                    self._host_lost()

    def _check_client(self) -> None:
        if self.client_pid is None:
            return
        try:
            os.kill(self.client_pid, 0)
        except ProcessLookupError:
            log.warning("client process %d is gone; exiting", self.client_pid)
            os._exit(1)
        except PermissionError:
            pass

    def _up(self, data: bytes) -> None:
        """Bytes from the client: sent to the host, then noted (the host decodes them meanwhile; no reply is read
        before they are noted)."""
        try:
            assert self.sock is not None
            self.sock.sendall(data)
        except OSError:
            pass  # the host is gone: its end of file, read next, starts the recovery
        self.up.feed(data)
        for frame in self.up.frames():
            self._note(frame.message)

    def _note(self, message: Any) -> None:
        if not isinstance(message, dict):
            return
        method = message.get("method")
        msg_id = message.get("id")
        if isinstance(msg_id, (int, str)) and not isinstance(msg_id, bool) and isinstance(method, str):
            self.in_flight[msg_id] = method  # other ids are the host's to refuse, and never answered by id
        if method in REPLAYED:
            kept = self.opening.setdefault(method, [])
            if method in (methods.CONTEXT_FOLLOW, methods.MEMORY_WATCH):
                kept.append(message)
            else:
                kept[:] = [message]
        elif method == "shutdown":
            self.shutdown = True
        elif method == "exit":
            self.exited = True

    def _down(self, data: bytes) -> None:
        """Bytes from the host: whole frames go to the client, except replies to what the relay replayed."""
        self.down += data
        out = []
        for frame in take_frames(self.down):
            msg_id = _response_id(frame)
            if msg_id is not None:
                self.in_flight.pop(msg_id, None)
                if msg_id in self.swallow:
                    self.swallow.discard(msg_id)
                    self._adopted(msg_id, frame)
                    continue
            out.append(frame)
        if out:
            _write_all(b"".join(out))

    def _adopted(self, msg_id: Any, frame: bytes) -> None:
        """The host's reply to the initialize this relay answered: it should have said the same."""
        if self.answered is None or msg_id != self.answered[0]:
            return
        try:
            reply = json.loads(frame[frame.find(b"\r\n\r\n") + 4:])
        except ValueError:
            reply = None
        if not isinstance(reply, dict) or reply.get("result") != self.answered[1]:
            log.error("initialize was answered with %s before the host's reply, which is %s", self.answered[1],
                      reply)
        self.answered = None

    def _host_lost(self) -> None:
        """The host died: answer what was in flight, attach to a new host, and open the session there again."""
        started = time.monotonic()
        log.warning("the host of %s is gone; %d requests in flight", self.db, len(self.in_flight))
        self.down.clear()  # a frame cut short never reaches the client
        errors = [encode({"jsonrpc": "2.0", "id": msg_id, "error": {
            "code": HOST_LOST, "message": "host connection lost", "data": {"retryable": True, "method": method}}})
            for msg_id, method in self.in_flight.items() if msg_id not in self.swallow]
        self.in_flight.clear()
        self.swallow.clear()
        if errors:
            _write_all(b"".join(errors))
        assert self.sock is not None
        self.sock.close()
        self.sock = self._reattach()
        log.warning("attached to a new host of %s in %.0f ms", self.db, (time.monotonic() - started) * 1000)
        replay = []
        for method in REPLAYED:
            for message in self.opening.get(method, []):
                if "id" in message:
                    self.replays += 1
                    message = {**message, "id": f"relay-replay-{self.replays}"}
                    self.swallow.add(message["id"])
                replay.append(encode(message))
        self.sock.sendall(b"".join(replay) + bytes(self.up.buffer))  # and the part of a message already sent

    def _reattach(self) -> socket.socket:
        deadline = time.monotonic() + RECONNECT_WAIT
        while True:
            try:
                return attach(self.db, self.memory_limit, self.log_args, self.log_to)
            except HostFailed as error:
                # Another relay's host may still be replaying the WAL, or the old one not quite gone.
                if time.monotonic() > deadline:
                    raise Refused(f"no host could be started for {database_key(self.db)}: {error}") from error
                time.sleep(0.05)


def _write_all(data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(1, view)
        view = view[written:]


def refuse(first: bytes, reason: str) -> int:
    """Answer every request with the reason sharing is impossible, until ``exit`` or end of input."""
    log.error("%s", reason)
    sys.stderr.write(f"context-sidecar: {reason}\n")
    reader = FrameReader()
    shutdown = False
    data = first
    while True:
        reader.feed(data)
        for frame in reader.frames():
            message = frame.message
            if not isinstance(message, dict):
                continue
            method = message.get("method")
            if method == "exit":
                return 0 if shutdown else 1
            if "id" not in message:
                continue
            if method == "shutdown":
                shutdown = True
                _write_all(encode({"jsonrpc": "2.0", "id": message["id"], "result": None}))
            else:
                _write_all(encode({"jsonrpc": "2.0", "id": message["id"], "error": {
                    "code": codes.STORAGE_ERROR, "message": reason}}))
        data = os.read(0, 1 << 16)
        if not data:
            return 0 if shutdown else 1


def serve(first: bytes, db: str, memory_limit: str, log_args: list[str], client_pid: int | None,
          log_to: dict[str, Any] | None = None,
          answer: Callable[[], tuple[Any, Any] | None] | None = None) -> int | None:
    """Relay stdio to the host of ``db``; None when this process should open the database itself instead.

    ``log_to`` (``logFile``, ``verbose``): where the host also writes this connection's log records.
    ``answer``: answers the client's initialize now, returning (id, result), or None when it cannot; called when
    this relay is about to start the host, so that the client need not wait for the host to open the database.
    The host's own reply to it is then checked against it and not sent.
    """
    answered: list[tuple[Any, Any]] = []

    def starting() -> None:
        if answer is not None and not answered and (done := answer()) is not None:
            answered.append(done)
            log.info("answered initialize; the host of %s starts behind it", database_key(db))

    deadline = time.monotonic() + HOST_LEAVING_WAIT
    while True:
        try:
            sock = attach(db, memory_limit, log_args, log_to, starting)
            break
        except HostFailed as error:
            if time.monotonic() < deadline:
                time.sleep(0.05)  # a host closing down (or killed) may hold the file for a moment longer
                continue
            log.info("not sharing %s: %s", db, error)
            return None
        except Refused as error:
            return refuse(first, str(error))
    relay = Relay(db, memory_limit, log_args, client_pid, log_to, answered[0] if answered else None)
    try:
        return relay.run(first, sock)
    except Refused as error:
        return refuse(bytes(relay.up.buffer), str(error))
