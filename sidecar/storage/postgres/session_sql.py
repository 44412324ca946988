"""How a session is read from a team database: its row and its live messages summed, in one statement."""

from __future__ import annotations

from sidecar.storage.live import SESSION_COLUMNS

PRUNABLE = ("(s.prunable_rule IS NOT NULL AND m.role = 'tool' AND m.tokens > split_part(s.prunable_rule, ':', 1)::int "
            "AND NOT (string_to_array(coalesce(m.tool_name, ''), ',') && "
            "string_to_array(split_part(s.prunable_rule, ':', 2), ',')))")
"""A message pruning may replace under its session's stored rule (``prune_rule_key``: ``N:tool,tool``)."""
SESSION_SQL = (
    f"SELECT {', '.join('s.' + column for column in SESSION_COLUMNS.split(', '))}, "
    "l.n, l.tokens, l.pn, l.ptokens, l.first, l.last, l.latest, s.owner = current_user "
    "FROM sessions s LEFT JOIN LATERAL ("
    "SELECT count(*) AS n, coalesce(sum(m.tokens), 0) AS tokens, "
    f"count(*) FILTER (WHERE {PRUNABLE}) AS pn, coalesce(sum(m.tokens) FILTER (WHERE {PRUNABLE}), 0) AS ptokens, "
    "min(m.seq) AS first, max(m.seq) AS last, max(m.created_at) AS latest "
    "FROM messages m WHERE m.session_id = s.session_id AND m.seq > s.live_after) l ON true")
"""A session with its live messages summed (``SessionRow.live_after``), and whether this role owns it."""
