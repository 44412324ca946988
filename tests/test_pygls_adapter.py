"""The pygls internals sidecar/rpc/pygls_adapter.py relies on still exist with the shapes it uses.

pyproject pins pygls to one minor version; this test is what tells a bump that breaks the server.
"""

from __future__ import annotations

import inspect

from pygls.lsp.server import LanguageServer
from pygls.protocol import JsonRPCProtocol, LanguageServerProtocol

from sidecar.rpc.pygls_adapter import SidecarProtocol


def parameters(function: object) -> list[str]:
    return list(inspect.signature(function).parameters)  # type: ignore[arg-type]


def test_the_overridden_result_sender_has_the_signature_we_override() -> None:
    assert parameters(JsonRPCProtocol._send_handler_result) == ["self", "future", "msg_id"]
    assert inspect.signature(JsonRPCProtocol._send_handler_result).parameters["msg_id"].kind \
        is inspect.Parameter.KEYWORD_ONLY
    assert SidecarProtocol._send_handler_result is not JsonRPCProtocol._send_handler_result


def test_the_private_senders_and_response_handler_exist() -> None:
    assert parameters(JsonRPCProtocol._send_data)[:2] == ["self", "data"]
    assert parameters(JsonRPCProtocol._send_response)[:3] == ["self", "msg_id", "result"]
    assert "error" in parameters(JsonRPCProtocol._send_response)
    assert parameters(JsonRPCProtocol._handle_response)[:4] == ["self", "msg_id", "result", "error"]


def test_a_protocol_instance_has_the_request_futures_converter_and_feature_manager() -> None:
    server = LanguageServer(name="probe", version="0", protocol_cls=LanguageServerProtocol)
    protocol = server.protocol
    assert isinstance(protocol._request_futures, dict)
    assert isinstance(protocol._result_types, dict)  # which pending ids are the server's own requests
    assert hasattr(protocol._converter, "unstructure")
    assert isinstance(protocol.fm.features, dict)
