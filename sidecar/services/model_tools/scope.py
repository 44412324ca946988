"""Which sessions a memory tool call reads: one session, or every session of a workspace, the current one first."""

from __future__ import annotations

import json
from typing import Any

import attrs

from sidecar.config.paths import workspace_key
from sidecar.config.project import of_workspace
from sidecar.rows import SessionRow, iso
from sidecar.services.state import Sidecar

TITLE_CHARS = 60


class IdNotInScope(Exception):
    """An id the model gave is in none of the sessions the call reads; the message tells it what to do."""


@attrs.define(frozen=True)
class ScopedSession:
    """One session a call reads, with the words that name it in results."""

    session_id: str
    label: str
    """``session ID (current; "title"; Claude Code 2.1.197; <first> to <last message>)``."""
    current: bool = False


@attrs.define(frozen=True)
class Scope:
    """The sessions of one call, in the order results list them."""

    sessions: tuple[ScopedSession, ...]
    workspace: str | None = None
    """None for a call on one session: results then name no session."""
    note: str | None = None
    """About the current session, said once at the top of a result."""

    @property
    def ids(self) -> list[str]:
        return [s.session_id for s in self.sessions]

    def label(self, session_id: str) -> str:
        return next(s.label for s in self.sessions if s.session_id == session_id)


def single(session_id: str) -> Scope:
    """The scope of a call on one session."""
    return Scope((ScopedSession(session_id, f"session {session_id}", current=True),))


def workspace_scope(sidecar: Sidecar, workspace: str, current: str | None) -> Scope:
    """Every session of ``workspace``: ``current`` first (else the most recently active), then by recency.

    ``current`` is the agent's session as its client knows it; a session of another workspace, or one not stored
    yet, is not read (sessions of other workspaces never are).
    """
    store = sidecar.store()
    belongs = of_workspace(workspace)
    rows = {row.session_id: row for row in store.sessions() if belongs(row)}
    spans = store.message_spans(list(rows))

    def recency(row: SessionRow) -> Any:
        return spans[row.session_id][1] if row.session_id in spans else row.updated_at

    ordered = sorted(rows.values(), key=recency, reverse=True)
    note = None
    if current is not None and current in rows:
        ordered.sort(key=lambda row: row.session_id != current)  # stable: the rest stay by recency
    elif current is not None:
        note = (f"The current session ({current}) has nothing stored yet; these are the workspace's earlier "
                "sessions, the most recent first.")
        current = None
    elif ordered:
        current = ordered[0].session_id  # no session named: the most recently active is taken as the current one
    sessions = []
    for row in ordered:
        parts = ["current" if row.session_id == current else "earlier"]
        if row.title:
            title = " ".join(row.title.split())
            parts.append(json.dumps(title if len(title) <= TITLE_CHARS else title[:TITLE_CHARS - 1] + "…",
                                    ensure_ascii=False))
        agent = agent_name(row.metadata)
        if agent:
            parts.append(agent)
        if row.session_id in spans:
            first, last = (iso(moment) or "?" for moment in spans[row.session_id])
            parts.append(first if first == last else f"{first} to {last}")
        sessions.append(ScopedSession(row.session_id, f"session {row.session_id} ({'; '.join(parts)})",
                                      current=row.session_id == current))
    return Scope(tuple(sessions), workspace=workspace_key(workspace), note=note)


def agent_name(metadata: dict[str, Any] | None) -> str | None:
    """The coding agent that wrote an imported session, with its version, from the session's metadata."""
    meta = metadata or {}
    if isinstance(meta.get("agent"), str):
        return str(meta["agent"])
    if isinstance(meta.get("claudeCodeVersion"), str):
        return f"Claude Code {meta['claudeCodeVersion']}"
    if isinstance(meta.get("cliVersion"), str):
        return f"Codex {meta['cliVersion']}"
    return None


def locate(sidecar: Sidecar, scope: Scope, item_id: str) -> tuple[str, str | None]:
    """The session holding a summary or message id, and a note when several do (the current one wins)."""
    if scope.workspace is None:
        return scope.sessions[0].session_id, None
    if not scope.sessions:
        raise IdNotInScope(f"there is no {item_id!r}: no session of this workspace is stored yet.")
    holders = [session_id for _, session_id in sidecar.store().holders(item_id, scope.ids)]
    if not holders:
        raise IdNotInScope(f"there is no summary or message {item_id!r} in the sessions of this workspace. Use an "
                           "id from a <summary> tag or from memory_grep results.")
    order = {session_id: index for index, session_id in enumerate(scope.ids)}
    holders = sorted(set(holders), key=order.__getitem__)
    if len(holders) == 1:
        return holders[0], None
    which = "the current session" if scope.sessions[order[holders[0]]].current else "the most recent of them"
    return holders[0], (f"{item_id} is in {len(holders)} sessions of this workspace; this is the one in session "
                        f"{holders[0]} ({which}); also in {', '.join(holders[1:])}.")
