"""``memory/callTool``: run one memory tool call of the model and answer the tool message to append."""

from __future__ import annotations

from typing import Any

from protocol import errors as codes
from protocol.types import CallToolParams, CallToolResult
from sidecar.services import memory
from sidecar.services.errors import SidecarError
from sidecar.services.model_tools import calls
from sidecar.services.model_tools import definitions as d
from sidecar.services.model_tools.query import query
from sidecar.services.state import Sidecar
from sidecar.summarizers.deterministic import truncate_to_tokens


async def call_tool(sidecar: Sidecar, params: CallToolParams, answerer: calls.Answerer | None) -> CallToolResult:
    """The tool message answering one model tool call."""
    memory.check_session_id(params.session_id)
    sidecar.session(params.session_id)  # -32001 before anything else
    cap = calls.RESULT_TOKENS
    try:
        arguments = calls.parse_arguments(params.name, params.arguments)
        if params.name == d.GREP:
            text = calls.grep(sidecar, params.session_id, arguments)
        elif params.name == d.DESCRIBE:
            text = calls.describe(sidecar, params.session_id, arguments)
        elif params.name == d.EXPAND:
            cap = calls.integer_argument(arguments, "tokenCap", d.EXPAND_DEFAULT_TOKEN_CAP, 1, d.EXPAND_MAX_TOKEN_CAP)
            text = calls.expand(sidecar, params.session_id, arguments, cap)
            cap += calls.HEADER_TOKENS
        else:
            text = await query(sidecar, params.session_id, arguments, answerer, calls.RESULT_TOKENS)
    except calls.ToolArgumentError as error:
        text = f"Error: {error}"
    except SidecarError as error:
        if error.code not in (codes.INVALID_PARAMS, codes.ID_NOT_FOUND):
            raise
        text = f"Error: {calls.model_words(error)}"
    message: dict[str, Any] = {"role": "tool", "content": truncate_to_tokens(text, cap)}
    if params.tool_call_id is not None:
        message["tool_call_id"] = params.tool_call_id
    return CallToolResult(message=message)
