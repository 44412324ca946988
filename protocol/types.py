"""Params and results of every context-sidecar method, as attrs classes.

Field names are snake_case here and camelCase on the wire (``session_id`` is
``sessionId``); ``sidecar.wire`` does the conversion. A field whose default is
``None`` is optional and left out of the JSON when it is ``None``.
"""

from __future__ import annotations

from typing import Any, Literal

import attrs

Message = dict[str, Any]
"""An OpenAI Chat Completions message, kept verbatim (plus optional ``id`` and ``metadata``)."""

SummaryKind = Literal["leaf", "condensed", "handoff"]
CompactionMode = Literal["incremental", "full", "handoff"]
CompactionTrigger = Literal["manual", "auto"]
UsageState = Literal["ok", "suggest", "compact", "compacting", "overflow"]
UsageSource = Literal["estimate", "provider"]
GrepScope = Literal["messages", "summaries", "both"]


@attrs.define
class Usage:
    """How full a session's context is, and what the client should do about it."""

    session_id: str
    tokens: int
    context_window: int
    percent: float
    threshold: int
    state: UsageState
    source: UsageSource
    messages: int
    summaries: int
    hint: str | None = None
    calibration: float | None = None
    reported_tokens: int | None = None
    cache_hit_rate: float | None = None
    """*Extension*: cacheRead / (input + cacheRead + cacheWrite) of the last context/reportUsage."""
    cache_hit_rate_smoothed: float | None = None
    """*Extension*: the same, exponentially smoothed over this process's reports."""


@attrs.define
class SessionInfo:
    """Session attributes a client may set on ingest."""

    context_window: int | None = None
    model: str | None = None
    title: str | None = None
    metadata: dict[str, Any] | None = None


@attrs.define
class IngestParams:
    session_id: str
    messages: list[Message]
    session: SessionInfo | None = None
    after: str | None = None
    """*Extension*: the id of the session's newest message, which these follow ("" when they open the session);
    when the session has moved on (another newest message), nothing is stored: error -32012 with ``lastId``."""


@attrs.define
class IngestResult:
    ids: list[str]
    duplicates: int
    usage: Usage
    warnings: list[str] | None = None
    """*extension*: messages stored that no assembled context will send, one "messages[i]: why" each."""


@attrs.define
class AssembleParams:
    session_id: str
    budget: int | None = None
    fresh_tail: int | None = None
    prune: bool | None = None
    reasoning: bool | None = None
    """*extension*: include assistant messages' stored ``reasoning`` (thinking) in the messages; default false."""
    tools: bool | None = None
    """*Extension*: also return the memory tools' definitions for the model."""
    since: str | None = None
    """*Extension*: the ``revision`` of the client's previous reply, to get only what changed."""
    overhead_tokens: int | None = None
    """*Extension*: tokens the client sends beside the messages (system prompt, tool definitions, messages it adds
    after them): without ``budget``, the budget leaves room for them, and usage counts them in the prompt."""
    scale: float | None = None
    """*Extension*: how much larger the client's rendering of a message is than the sidecar's count of it (at least
    1): without ``budget``, the budget is divided by it."""
    reply_tokens: int | None = None
    """*Extension*: the most tokens the client lets the model answer with (its request's max tokens): without
    ``budget``, the budget leaves room for them where the reserve is smaller (up to half the window)."""


@attrs.define
class ContextItem:
    """One entry of an assembled context, beside the message it became (written by ``sidecar.assemble_reply``)."""

    kind: str
    id: str
    tokens: int
    pruned: bool | None = None


MAX_CACHE_BREAKPOINTS = 4
"""Cache markers a prompt may carry: Anthropic's limit per request."""


@attrs.define
class AssembleResult:
    """The reply of context/assemble; the server writes it with ``sidecar.assemble_reply.encode_assemble_result``."""

    messages: list[Message]
    items: list[ContextItem]
    tokens: int
    dropped: int
    over_budget: bool
    usage: Usage
    tools: list[dict[str, Any]] | None = None
    revision: str | None = None
    """*Extension*: names this prompt, for a later ``since``."""
    stable_prefix: int | None = None
    """*Extension*: leading messages unchanged since the session's previous assemble."""
    cache_breakpoints: list[int] | None = None
    """*Extension*: at most ``MAX_CACHE_BREAKPOINTS`` message indexes (of the whole prompt) to put provider cache
    markers after."""
    delta: bool | None = None
    """*Extension*, with ``since``: true when ``messages``/``items`` only hold what to append after ``keep``."""
    keep: int | None = None
    """*Extension*, when ``delta``: leading messages of the previous prompt to keep."""
    budget: int | None = None
    """*Extension*: the budget the prompt was assembled within."""
    fixed_breakpoints: list[int] | None = None
    """*Extension*: the ``cache_breakpoints`` that messages appended to this prompt leave where they are (the ends of
    its leading system messages and summaries): an appended prompt's are these, its last kept message, its last."""
    reason: str | None = None
    """*Extension*: why the prompt is over its budget, when it is."""


@attrs.define
class CompactParams:
    session_id: str
    mode: CompactionMode | None = None
    focus: str | None = None
    work_done_token: int | str | None = None


@attrs.define
class CompactResult:
    compacted: bool
    mode: str
    summary_ids: list[str]
    tokens_before: int
    tokens_after: int
    rounds: int
    usage: Usage
    reason: str | None = None
    summary: str | None = None


@attrs.define
class ExpandParams:
    session_id: str
    id: str
    token_cap: int | None = None


@attrs.define
class ExpandItem:
    kind: str
    id: str
    tokens: int
    message: Message | None = None
    summary: str | None = None
    original: list[str] | None = None
    """*extension*: an imported message's original transcript lines, verbatim."""


@attrs.define
class ExpandResult:
    id: str
    kind: str
    items: list[ExpandItem]
    truncated: bool


@attrs.define
class GrepParams:
    session_id: str
    pattern: str
    regex: bool | None = None
    case_sensitive: bool | None = None
    scope: GrepScope | None = None
    limit: int | None = None


@attrs.define
class GrepMatch:
    kind: str
    id: str
    snippet: str
    covered_by: str | None = None


@attrs.define
class GrepResult:
    matches: list[GrepMatch]
    truncated: bool


@attrs.define
class CallToolParams:
    """*Extension*: a memory tool call the model made, ``arguments`` being the JSON text it wrote."""

    name: str
    arguments: str
    session_id: str | None = None
    """The session the call reads; with ``workspace``, the agent's current session, if known."""
    tool_call_id: str | None = None
    workspace: str | None = None
    """*Extension*: read every session of this workspace (a directory), the current one first."""


@attrs.define
class CallToolResult:
    message: Message
    """The ``tool`` message to append to the conversation."""


@attrs.define
class DescribeParams:
    session_id: str
    id: str


@attrs.define
class DescribeResult:
    id: str
    kind: str
    depth: int
    tokens: int
    source_tokens: int
    earliest_at: str | None
    latest_at: str | None
    message_count: int
    parents: list[str]
    children: list[str]
    content: Any
    pinned: bool | None = None
    """*Extension*: for a message, whether it is pinned."""
    rules: list[str] | None = None
    """*Extension*: for a summary, the standing rules it carries verbatim."""
    rules_left_out: list[str] | None = None
    """*Extension*: for a summary, rules the cap on carried rules left out."""


@attrs.define
class PinParams:
    """*Extension*: params of ``memory/pin``."""

    session_id: str
    ids: list[str]
    pinned: bool


@attrs.define
class PinResult:
    ids: list[str]
    """The messages whose flag changed."""
    usage: Usage


@attrs.define
class RulesParams:
    """*Extension*: params of ``memory/rules``."""

    session_id: str


@attrs.define
class RulesResult:
    """*Extension*: what a session's summaries would carry of its whole history: standing rules and files."""

    session_id: str
    rules: list[str]
    """Standing rules of its user and system messages, verbatim, earliest first, within the carried cap."""
    rules_left_out: list[str]
    """Rules the cap left out."""
    read: list[str]
    """Files its tool calls read and did not modify, most recent first."""
    modified: list[str]
    """Files its tool calls modified, most recent first."""


@attrs.define
class SessionsParams:
    """Params of ``memory/sessions``."""

    workspace: str | None = None
    """Only sessions of this workspace (a directory path)."""


@attrs.define
class SessionSummary:
    session_id: str
    messages: int
    summaries: int
    tokens: int
    updated_at: str
    title: str | None = None
    model: str | None = None
    context_window: int | None = None
    workspace: str | None = None


@attrs.define
class SessionsResult:
    sessions: list[SessionSummary]


@attrs.define
class FollowParams:
    """Params of ``context/follow`` (*extension*): a session, or every session of a workspace, or both."""

    follow: bool
    session_id: str | None = None
    workspace: str | None = None


@attrs.define
class FollowResult:
    """What the connection follows by request after the change (it also follows the sessions it worked on)."""

    sessions: list[str]
    workspaces: list[str]


@attrs.define
class WatchParams:
    """Params of ``memory/watch`` (*extension*): follow a workspace's agent transcripts while the connection lives."""

    workspace: str
    watch: bool | None = None
    """False stops this connection's watch of the workspace; default true."""
    env: dict[str, str] | None = None
    """The client's HOME, CLAUDE_CONFIG_DIR, CODEX_HOME, PI_CODING_AGENT_DIR, PI_CODING_AGENT_SESSION_DIR (the others
    are ignored); the host's own environment for those left out."""
    directories: list[str] | None = None
    """More directories of transcripts (of any supported agent) to search for the workspace's sessions."""


@attrs.define
class WatchedTranscript:
    """One transcript file the host follows for the workspace."""

    path: str
    agent: str
    """claude-code, codex, pi, or the format found in a directory named by ``directories``."""
    state: str
    """``queued``: found, not read yet; ``following``: imported and followed; ``waiting``: nothing to import yet;
    ``skipped``: another client stores its session (``problem`` says which); ``error``: see ``problem``."""
    session_id: str | None = None
    problem: str | None = None


@attrs.define
class WatchedDirectory:
    """One directory searched for the workspace's transcripts."""

    path: str
    agent: str
    exists: bool
    problem: str | None = None
    """Why it cannot be read (it may appear later: it is searched again)."""


@attrs.define
class WatchResult:
    """What the host follows for the workspace after the request (for every connection that watches it)."""

    workspace: str
    watching: bool
    transcripts: list[WatchedTranscript]
    directories: list[WatchedDirectory]
    connections: int = 0
    """How many connections watch the workspace in these directories (this one included)."""


@attrs.define
class RecordCompactionParams:
    """Params of ``memory/recordCompaction`` (*extension*): a compaction the agent made itself."""

    session_id: str
    summary: str
    source: str
    """Who compacted: the agent (``claude-code``, ``codex``, ``pi``, …); the summary's summarizer."""
    trigger: CompactionTrigger | None = None
    id: str | None = None
    """The agent's id of this compaction; a second record with the same id (or the same text) changes nothing."""


@attrs.define
class RecordCompactionResult:
    recorded: bool
    """False when this compaction was recorded before (``summary_id`` is that record's) or could not be (``reason``)."""
    usage: Usage
    summary_id: str | None = None
    reason: str | None = None


@attrs.define
class DeleteSessionParams:
    session_id: str


@attrs.define
class DeleteSessionResult:
    deleted: bool


@attrs.define
class UsageParams:
    session_id: str


@attrs.define
class ReportUsageParams:
    session_id: str
    input_tokens: int
    output_tokens: int
    cache_read_tokens: int | None = None
    cache_write_tokens: int | None = None


@attrs.define
class ImportParams:
    """Params of ``memory/import``: a transcript file on the server's machine."""

    path: str
    session_id: str | None = None
    format: str | None = None
    follow: bool | None = None
    """*extension*: the file is being written; a last line without its newline is left for the next import."""


@attrs.define
class ImportResult:
    session_id: str
    format: str
    ids: list[str]
    duplicates: int
    skipped: list[str]
    usage: Usage
    replaced: int | None = None
    """*extension*: stored messages rewritten in place because the transcript grew (a stand-in result
    replaced by the real one, an assistant message that gained its tool calls or reasoning)."""
    compactions: int | None = None
    """*extension*: the agent's own compactions found in the transcript and recorded by this import."""


@attrs.define
class DidCompactParams:
    session_id: str
    mode: str
    trigger: CompactionTrigger
    summary_ids: list[str]
    tokens_before: int
    tokens_after: int
    tokens_rewritten: int | None = None
    """*Extension*: prompt tokens from the first changed message on (a provider cache miss)."""
    source: str | None = None
    """*Extension*: the agent whose own compaction this was (memory/recordCompaction, or found in its transcript);
    absent for the sidecar's compactions."""
    summarizers: dict[str, int] | None = None
    """*Extension*: how many of the new summaries each summarizer wrote (``client``, ``openai``, ``deterministic``);
    absent for an agent's own compaction."""


@attrs.define
class DidPruneParams:
    """*Extension*: a prune step replaced these tool outputs by placeholders, for good."""

    session_id: str
    ids: list[str]
    tokens_saved: int
    tokens_rewritten: int


@attrs.define
class WillCompactParams:
    session_id: str
    mode: str
    trigger: CompactionTrigger
    tokens_before: int
    message_count: int
    focus: str | None = None


@attrs.define
class WillCompactResult:
    action: Literal["proceed", "cancel"]
    summary: str | None = None



@attrs.define
class SummarizeParams:
    """*Extension*: one summarizer call the server asks a client that declared ``summaries`` to run on its model."""

    session_id: str
    """The session whose history is summarized: the client runs the call as that session's agent."""
    kind: SummaryKind
    messages: list[Message]
    """The prompt: a ``system`` message (the summarizer's instructions) and a ``user`` message (the history)."""
    max_tokens: int
    """The most tokens the answer may take."""
    deadline_seconds: float
    """Seconds the server waits for the answer (``llm.timeoutSeconds``): the client gives up its call then."""
    aggressive: bool = False
    """A second try after an over-long summary."""


@attrs.define
class SummaryCallUsage:
    """*Extension*: what a client's summary call cost, as its provider reported it."""

    input_tokens: int
    output_tokens: int
    cache_read_tokens: int | None = None
    cache_write_tokens: int | None = None


@attrs.define
class SummarizeResult:
    """*Extension*: the summary a client's model wrote."""

    text: str
    model: str | None = None
    """The model that wrote it."""
    usage: SummaryCallUsage | None = None
