"""Bad bytes on the wire: the server answers what it can, resynchronises, and keeps serving."""

from __future__ import annotations

import json
import os
import select
import subprocess
import time
from typing import Any

import pytest

from protocol import errors
from sidecar.framing import FrameReader, encode
from tests.conftest import SERVER_COMMAND


class RawPeer:
    """The sidecar as a subprocess, spoken to in raw bytes."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen([*SERVER_COMMAND, "--db", ":memory:"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        self.reader = FrameReader()
        self.pending: list[dict[str, Any]] = []

    def send(self, data: bytes) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(data)
        self.proc.stdin.flush()

    def request(self, msg_id: int, method: str, params: Any = None) -> None:
        message: dict[str, Any] = {"jsonrpc": "2.0", "id": msg_id, "method": method}
        if params is not None:
            message["params"] = params
        self.send(encode(message))

    def receive(self, timeout: float = 10) -> dict[str, Any]:
        """The next message that is not a notification."""
        assert self.proc.stdout is not None
        deadline = time.monotonic() + timeout
        while True:
            self.pending += [f.message for f in self.reader.frames() if "method" not in f.message]
            if self.pending:
                return self.pending.pop(0)
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError("no reply")
            ready, _, _ = select.select([self.proc.stdout], [], [], remaining)
            if ready:
                data = os.read(self.proc.stdout.fileno(), 65536)
                if not data:
                    raise EOFError("server closed its output")
                self.reader.feed(data)

    def close(self) -> int:
        self.request(999, "shutdown")
        self.receive()
        self.send(encode({"jsonrpc": "2.0", "method": "exit"}))
        return self.proc.wait(10)


@pytest.fixture
def peer():
    raw = RawPeer()
    raw.request(1, "initialize", {"capabilities": {}})
    assert raw.receive()["id"] == 1
    raw.send(encode({"jsonrpc": "2.0", "method": "initialized", "params": {}}))
    yield raw
    if raw.proc.poll() is None:
        raw.proc.kill()
    raw.proc.wait()


def alive(peer: RawPeer, msg_id: int = 50) -> bool:
    peer.request(msg_id, "memory/sessions", {})
    reply = peer.receive()
    return reply.get("id") == msg_id and reply.get("result") == {"sessions": []}


def test_body_that_is_not_json_gets_parse_error(peer):
    body = b'{"jsonrpc": "2.0", "id": 7, "method": '
    peer.send(b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
    reply = peer.receive()
    assert reply["id"] is None and reply["error"]["code"] == errors.PARSE_ERROR
    assert alive(peer)
    assert peer.close() == 0


def test_invalid_utf8_gets_parse_error(peer):
    body = b'{"jsonrpc": "2.0", "id": 7, "method": "\xff\xfe"}'
    peer.send(b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
    assert peer.receive()["error"]["code"] == errors.PARSE_ERROR
    assert alive(peer)


def test_content_length_too_small_resynchronises(peer):
    body = json.dumps({"jsonrpc": "2.0", "id": 8, "method": "memory/sessions", "params": {}}).encode()
    peer.send(b"Content-Length: %d\r\n\r\n%s" % (len(body) - 5, body))
    assert peer.receive()["error"]["code"] == errors.PARSE_ERROR
    assert alive(peer)


def test_content_length_too_large_is_cut_at_the_next_header(peer):
    body = json.dumps({"jsonrpc": "2.0", "id": 9, "method": "memory/sessions", "params": {}}).encode()
    peer.send(b"Content-Length: %d\r\n\r\n%s" % (len(body) + 40, body))
    peer.request(10, "memory/sessions", {})
    first, second = peer.receive(), peer.receive()
    assert {first["id"], second["id"]} == {9, 10}
    assert alive(peer)


def test_content_length_too_large_with_nothing_after_it_is_judged_when_input_stalls(peer):
    body = json.dumps({"jsonrpc": "2.0", "id": 11, "method": "memory/sessions", "params": {}}).encode()
    peer.send(b"Content-Length: %d\r\n\r\n%s" % (len(body) + 40, body))
    assert peer.receive(timeout=5)["id"] == 11
    assert alive(peer)


def test_junk_between_messages_is_skipped(peer):
    peer.send(b"garbage without a header\r\n\r\n")
    assert alive(peer)


@pytest.mark.parametrize(("message", "code"), [
    ({"id": 20, "method": "memory/sessions", "params": {}}, errors.INVALID_REQUEST),
    ({"jsonrpc": "1.0", "id": 21, "method": "memory/sessions"}, errors.INVALID_REQUEST),
    ({"jsonrpc": "2.0", "id": 22}, errors.INVALID_REQUEST),
    ({"jsonrpc": "2.0", "id": 23, "method": 5}, errors.INVALID_REQUEST),
    ({"jsonrpc": "2.0", "id": 24, "method": "memory/ingest"}, errors.INVALID_PARAMS),
    ({"jsonrpc": "2.0", "id": 25, "method": "memory/ingest", "params": "text"}, errors.INVALID_PARAMS),
    ({"jsonrpc": "2.0", "id": 26, "method": "no/such/method", "params": {}}, errors.METHOD_NOT_FOUND),
    ({"jsonrpc": "2.0", "id": 27, "method": "context/reportUsage", "params": {}}, errors.INVALID_REQUEST),
])
def test_every_request_with_an_id_is_answered(peer, message, code):
    peer.send(encode(message))
    reply = peer.receive()
    assert reply["id"] == message["id"]
    assert reply["error"]["code"] == code
    assert alive(peer)


def test_a_json_array_gets_invalid_request(peer):
    peer.send(encode([{"jsonrpc": "2.0", "id": 30, "method": "memory/sessions"}]))
    reply = peer.receive()
    assert reply["id"] is None and reply["error"]["code"] == errors.INVALID_REQUEST


def test_deeply_nested_params_are_invalid_params_not_internal_error(peer):
    nested: Any = "leaf"
    for _ in range(500):
        nested = {"a": nested}
    peer.request(31, "memory/ingest", {"sessionId": "s", "messages": [nested]})
    reply = peer.receive()
    assert reply["error"]["code"] == errors.INVALID_PARAMS
    deep_metadata: Any = 1
    for _ in range(500):
        deep_metadata = [deep_metadata]
    peer.request(32, "memory/ingest", {"sessionId": "s", "messages": [
        {"role": "user", "content": "x", "metadata": {"deep": deep_metadata}}]})
    stored = peer.receive()
    assert stored["id"] == 32 and stored["result"]["duplicates"] == 0


def test_valid_json_too_deep_to_decode_gets_invalid_params_with_its_id(peer):
    deep = "[" * 5000 + "]" * 5000
    body = f'{{"jsonrpc": "2.0", "id": 33, "method": "memory/ingest", "params": {{"sessionId": "s", "x": {deep}}}}}'
    peer.send(b"Content-Length: %d\r\n\r\n%s" % (len(body), body.encode()))
    reply = peer.receive()
    assert reply["id"] == 33 and reply["error"]["code"] == errors.INVALID_PARAMS
    assert alive(peer)


def test_cancel_sent_with_the_request_cancels_it(peer):
    request = encode({"jsonrpc": "2.0", "id": 40, "method": "memory/ingest",
                      "params": {"sessionId": "s", "messages": [{"role": "user", "content": "hi"}]}})
    cancel = encode({"jsonrpc": "2.0", "method": "$/cancelRequest", "params": {"id": 40}})
    peer.send(request + cancel)
    reply = peer.receive()
    assert reply["id"] == 40 and reply["error"]["code"] == errors.REQUEST_CANCELLED
    peer.request(41, "memory/sessions", {})
    assert peer.receive()["result"] == {"sessions": []}  # the cancelled ingest stored nothing


def test_frame_reader_handles_split_and_joined_frames():
    stream = encode({"a": 1}) + encode({"b": "ü"}) + encode([1, 2])
    reader = FrameReader()
    out = []
    for byte in range(len(stream)):
        reader.feed(stream[byte:byte + 1])
        out += [frame.message for frame in reader.frames()]
    assert out == [{"a": 1}, {"b": "ü"}, [1, 2]]


def test_take_frames_cuts_whole_raw_frames_and_leaves_a_partial_one() -> None:
    from sidecar.framing import encode, take_frames

    first, second = encode({"id": 1, "result": "é"}), encode({"method": "x"})
    typed = b'Content-Type: application/vscode-jsonrpc; charset=utf-8\r\nContent-Length: 2\r\n\r\n{}'
    buffer = bytearray(first + typed + second + second[:7])
    assert take_frames(buffer) == [first, typed, second]
    assert buffer == bytearray(second[:7])
    buffer += second[7:-1]
    assert take_frames(buffer) == [] and buffer == bytearray(second[:-1])
