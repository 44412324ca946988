"""Requests as read: each element's clean value and text, the units they make and the units' ids.

All of it follows from the bytes alone (an id is chained on its parent's and computed from what the unit says), so a
request whose leading elements are an earlier request's bytes (any conversation's) takes them from that request:
only the elements that are new are cleaned, grouped into units and hashed.
"""

from __future__ import annotations

import bisect
import collections
from typing import Any

import attrs

from sidecar.proxy.adapters.base import Adapter, Request, Unit, unit_id
from sidecar.proxy.body import Body

KEPT = 8
"""Earlier requests kept to read new ones against (agents, and an agent's side requests, interleave)."""


@attrs.define(eq=False)
class Seen:
    """A request's conversation as read."""

    body: Body
    values: list[Any]
    """Each element's value, the agent's cache markers taken out."""
    texts: list[str]
    """Each element's JSON text, verbatim but for those markers."""
    units: list[Unit]
    firsts: list[int]
    """The index of each unit's first element."""
    ids: list[str]
    """Each unit's id."""


class Reader:
    """Reads requests against the most recent ones."""

    def __init__(self) -> None:
        self._kept: collections.deque[Seen] = collections.deque(maxlen=KEPT)

    def read(self, adapter: Adapter, raw: bytes) -> tuple[Request, Seen]:
        """The request (BadRequest when the API would refuse it) and its conversation as read."""
        request = adapter.read(raw, [seen.body for seen in self._kept])
        body = request.body
        if not body.array or not adapter.manageable(body.values):
            if body.reused:
                request = adapter.read(raw)  # every value read: the request goes upstream as it is
            request.body.basis = None
            return request, Seen(request.body, [], [], [], [], [])
        basis = next((seen for seen in self._kept if seen.body is body.basis), None)
        body.basis = None  # no chain of bodies kept alive
        seen = _seen(adapter, request, basis)
        self._kept.appendleft(seen)
        return request, seen


def _seen(adapter: Adapter, request: Request, basis: Seen | None) -> Seen:
    body = request.body
    reused = body.reused if basis is not None else 0
    raw = body.values[body.key]
    values = basis.values[:reused] if basis is not None else []
    texts = basis.texts[:reused] if basis is not None else []
    for value, text in zip(raw[reused:], body.texts, strict=True):
        value, text = adapter.clean(value, text)
        values.append(value)
        texts.append(text)
    units: list[Unit] = []
    firsts: list[int] = []
    ids: list[str] = []
    if basis is not None and reused:
        # The units that start and end within the elements taken over, but the last (a run of Responses items
        # may go on): all but the last two that start there.
        keep = max(bisect.bisect_right(basis.firsts, reused) - 2, 0)
        units, firsts, ids = basis.units[:keep], basis.firsts[:keep], basis.ids[:keep]
    start = firsts[-1] + len(units[-1].texts) if units else 0
    parent = ids[-1] if ids else ""
    for unit in adapter.units(values[start:], texts[start:]):
        firsts.append(start)
        start += len(unit.texts)
        parent = unit_id(parent, adapter.identity(unit))
        units.append(unit)
        ids.append(parent)
    return Seen(body, values, texts, units, firsts, ids)
