"""``memory/callTool``: run one memory tool call of the model and answer the tool message to append."""

from __future__ import annotations

from typing import Any

from protocol import errors as codes
from protocol.types import CallToolParams, CallToolResult
from sidecar.services import memory
from sidecar.services.errors import SidecarError, invalid_params
from sidecar.services.model_tools import calls
from sidecar.services.model_tools import definitions as d
from sidecar.services.model_tools.query import query
from sidecar.services.model_tools.scope import IdNotInScope, Scope, single, workspace_scope
from sidecar.services.state import Sidecar
from sidecar.summarizers.deterministic import truncate_to_tokens

WORKSPACE_MAX_CHARS = 4096


async def call_tool(sidecar: Sidecar, params: CallToolParams, answerer: calls.Answerer | None) -> CallToolResult:
    """The tool message answering one model tool call, over one session or every session of a workspace."""
    scope = _scope(sidecar, params)
    cap = calls.RESULT_TOKENS
    try:
        arguments = calls.parse_arguments(params.name, params.arguments)
        if params.name == d.GREP:
            text = calls.grep(sidecar, scope, arguments)
        elif params.name == d.DESCRIBE:
            text = calls.describe(sidecar, scope, arguments)
        elif params.name == d.EXPAND:
            cap = calls.integer_argument(arguments, "tokenCap", d.EXPAND_DEFAULT_TOKEN_CAP, 1, d.EXPAND_MAX_TOKEN_CAP)
            text = calls.expand(sidecar, scope, arguments, cap)
            cap += calls.HEADER_TOKENS
        else:
            text = await query(sidecar, scope, arguments, answerer, calls.RESULT_TOKENS)
    except (calls.ToolArgumentError, IdNotInScope) as error:
        text = f"Error: {error}"
    except SidecarError as error:
        if error.code not in (codes.INVALID_PARAMS, codes.ID_NOT_FOUND):
            raise
        text = f"Error: {calls.model_words(error)}"
    message: dict[str, Any] = {"role": "tool", "content": truncate_to_tokens(text, cap)}
    if params.tool_call_id is not None:
        message["tool_call_id"] = params.tool_call_id
    return CallToolResult(message=message)


def _scope(sidecar: Sidecar, params: CallToolParams) -> Scope:
    """The sessions the call reads; -32602 or -32001 for params no call can be made with."""
    if params.workspace is None:
        if params.session_id is None:
            raise invalid_params("sessionId is required unless workspace is given", "sessionId")
        memory.check_session_id(params.session_id)
        sidecar.session(params.session_id)  # -32001 before anything else
        return single(params.session_id)
    if not params.workspace.strip() or len(params.workspace) > WORKSPACE_MAX_CHARS or "\0" in params.workspace:
        raise invalid_params(f"workspace must be a directory path of at most {WORKSPACE_MAX_CHARS} characters",
                             "workspace")
    if params.session_id is not None:
        memory.check_session_id(params.session_id)
    return workspace_scope(sidecar, params.workspace, params.session_id)
