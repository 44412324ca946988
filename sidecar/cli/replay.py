"""``context-sidecar replay``: walk a transcript through a real sidecar turn by turn, as an agent would."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import io
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from protocol import errors as codes
from protocol.types import AssembleResult, DidCompactParams, Message, SessionInfo, Usage
from sidecar.cli import plural, report_error, say, spawn_server, usage_text
from sidecar.cli.prompt_cache import Prices, PromptCache, PromptCost
from sidecar.client import SidecarClient, SidecarRequestError
from sidecar.importers import ImportFormatError, ParsedTranscript, parse_transcript

REPORT_POLICIES = {
    "auto": "the transcript's provider usage is reported until the sidecar prunes or compacts",
    "always": "the transcript's provider usage is reported every turn",
    "never": "no provider usage is reported",
}
SETTLE_TIMEOUT = 300.0
POLL_SECONDS = 0.02


@dataclasses.dataclass
class Turn:
    """A user message and everything up to the next one; ``opening`` ends with the user message."""

    number: int
    opening: list[Message]
    rest: list[Message]

    @property
    def messages(self) -> list[Message]:
        """All messages of the turn in order."""
        return self.opening + self.rest

    @property
    def steps(self) -> list[list[Message]]:
        """The rest as agent steps: each assistant message with the tool results (and notes) after it."""
        steps: list[list[Message]] = []
        for message in self.rest:
            if message.get("role") == "assistant" or not steps:
                steps.append([])
            steps[-1].append(message)
        return steps


@dataclasses.dataclass
class Stats:
    """What the replay did, for the final table."""

    stored: int = 0
    duplicates: int = 0
    reports: int = 0
    compactions: list[DidCompactParams] = dataclasses.field(default_factory=list)
    notifications: int = 0
    ingest_s: float = 0.0
    assemble_s: float = 0.0
    wait_s: float = 0.0
    last_sent: tuple[int, int] = (0, 0)
    """Messages and tokens of the last assembled call."""


def split_turns(messages: list[Message]) -> list[Turn]:
    """Turns of a transcript; messages before the first user message open the first turn."""
    turns: list[Turn] = []
    leading: list[Message] = []
    for message in messages:
        if message.get("role") == "user":
            turns.append(Turn(len(turns) + 1, [*leading, message], []))
            leading = []
        elif turns:
            turns[-1].rest.append(message)
        else:
            leading.append(message)
    if leading:  # a transcript without any user message is replayed as one turn
        turns.append(Turn(1, leading, []))
    return turns


def provider_usage(messages: list[Message]) -> dict[str, int] | None:
    """The usage the provider reported for the last call of these messages, from the transcript's metadata."""
    for message in reversed(messages):
        usage = (message.get("metadata") or {}).get("usage") if message.get("role") == "assistant" else None
        if isinstance(usage, dict) and isinstance(usage.get("input"), int):
            return usage
    return None


def _reshaped(assembled: AssembleResult) -> bool:
    """Whether the assembled context differs from the plain transcript (summaries, pruned or dropped items)."""
    return assembled.dropped > 0 or any(item.kind == "summary" or item.pruned for item in assembled.items)


def run_replay(path: str, db: str | None, session: str | None, fmt: str, context_window: int | None,
               mode: str, quiet: bool, report_usage: str = "auto", prices: Prices | None = None,
               compare_prune_off: bool = False, settings: dict[str, Any] | None = None) -> int:
    """Run the replay (and, if asked, again with pruning off on a fresh temporary DB); returns the exit code."""
    transcript = Path(path).expanduser()
    try:
        parsed = parse_transcript(transcript, fmt)
    except (ImportFormatError, OSError) as error:
        print(f"context-sidecar replay: error: {error}", file=sys.stderr)
        return 1
    if not parsed.messages:
        print(f"context-sidecar replay: error: no messages in {transcript}", file=sys.stderr)
        return 1
    prices = prices or Prices()
    try:
        with _storage(db) as (db_path, fresh):
            replay = _Replay(transcript, parsed, session, context_window, mode, quiet, report_usage, prices,
                             settings=settings)
            code = asyncio.run(replay.run(db_path, fresh))
        if code:
            return code
        extra: list[tuple[str, str]] = []
        if compare_prune_off:
            say()
            say("replaying again with pruning off (prune.enabled false, a fresh temporary DB) to compare …")
            with _storage(None) as (off_db, _), contextlib.redirect_stdout(io.StringIO()):
                off = _Replay(transcript, parsed, session, context_window, mode, True, report_usage, prices,
                              prune=False, settings=settings)
                code = asyncio.run(off.run(off_db, True))
            if code:
                return code
            extra = _comparison(replay.cache, off.cache)
        replay.table(extra)
        return 0
    except SidecarRequestError as error:
        return report_error("replay", error)


@contextlib.contextmanager
def _storage(db: str | None) -> Iterator[tuple[str, bool]]:
    """The DB file to use and whether it is a fresh temporary one (removed afterwards)."""
    if db is not None:
        yield db, False
        return
    with tempfile.TemporaryDirectory(prefix="context-sidecar-replay-") as directory:
        yield str(Path(directory) / "replay.duckdb"), True


async def replay_cache(parsed: ParsedTranscript, name: str, db: str, prune: bool = True,
                       prices: Prices | None = None, context_window: int | None = None,
                       settings: dict[str, Any] | None = None) -> PromptCache:
    """Replay a parsed transcript silently on a new DB file with default settings, but for ``settings`` (sections
    of camelCase settings, merged over the replay's own); its prompts' cache figures."""
    replay = _Replay(Path(name), parsed, None, context_window, "incremental", True, "auto", prices or Prices(),
                     prune=prune, settings=settings)
    with contextlib.redirect_stdout(io.StringIO()):  # the timeline is not wanted here
        code = await replay.run(db, True)
    if code:
        raise SidecarRequestError(codes.INTERNAL_ERROR, f"replay of {name} into {db} failed")
    return replay.cache


def _comparison(on: PromptCache, off: PromptCache) -> list[tuple[str, str]]:
    """Summary rows comparing the replay with its pruning-off twin."""
    ratio = f"{on.cost / off.cost:.2f}x" if off.cost else "n/a (no prompt tokens)"
    return [("pruning off", f"prefix hits {hit_percent(off)}, input cost {off.cost:,.0f}"),
            ("cost ratio", f"{ratio} (input cost with pruning on / off)")]


def hit_percent(cache: PromptCache) -> str:
    """The hit rate as a percentage."""
    return f"{cache.hit_rate * 100:.1f}%"


class _Replay:
    """One replay run against one sidecar."""

    def __init__(self, path: Path, parsed: ParsedTranscript, session: str | None, context_window: int | None,
                 mode: str, quiet: bool, report_usage: str, prices: Prices, prune: bool = True,
                 settings: dict[str, Any] | None = None) -> None:
        self.path = path
        self.parsed = parsed
        self.session_id = session or parsed.suggested_session_id or path.stem
        self.context_window = context_window
        self.mode = mode
        self.quiet = quiet
        self.report_usage = report_usage
        self.turns = split_turns(parsed.messages)
        self.stats = Stats()
        self.pending: list[DidCompactParams] = []
        self.notes: list[str] = []
        self.cache = PromptCache(prices)
        self.prune = prune
        self.settings = settings or {}
        self.finished: tuple[Usage, float] | None = None

    async def run(self, db: str, fresh: bool) -> int:
        """Spawn the sidecar on ``db`` and replay every turn; returns the exit code. ``table`` prints the summary."""
        started = time.monotonic()
        # The sidecar weighs prune steps at the prices the replay bills.
        prune = {"cacheReadPrice": self.cache.prices.read, "cacheWritePrice": self.cache.prices.write}
        settings: dict[str, Any] = {"compaction": {"auto": True, "mode": self.mode}, "prune": prune}
        if not self.prune:
            prune["enabled"] = False
        for name, value in self.settings.items():
            section = settings.get(name)
            settings[name] = {**section, **value} if isinstance(section, dict) and isinstance(value, dict) else value
        async with await spawn_server(db, settings) as client:
            client.on_compact(self._compacted)
            client.on_usage(self._counted)
            self._header(client, db, fresh)
            listed = await client.sessions()
            existing = next((s for s in listed.sessions if s.session_id == self.session_id), None)
            if existing is not None and existing.messages:
                print(f"context-sidecar replay: error: session {self.session_id!r} already holds "
                      f"{existing.messages} messages in {db}; pass --session NEW to replay into a new one",
                      file=sys.stderr)
                return 1
            usage: Usage | None = None
            for turn in self.turns:
                usage = await self._turn(client, turn, usage)
            assert usage is not None
            self.finished = (usage, time.monotonic() - started)
        return 0

    def _header(self, client: SidecarClient, db: str, fresh: bool) -> None:
        with_usage = sum(1 for turn in self.turns if provider_usage(turn.rest))
        pid = client.process.pid if client.process else "?"
        where = "a fresh temporary DB, removed at exit" if fresh else "kept"
        kind = f"{'an' if self.parsed.format[0] in 'aeiou' else 'a'} {self.parsed.format}"
        say(f"context-sidecar replay: {self.path.name}, {kind} transcript of "
            f"{plural(len(self.parsed.messages), 'message')} in {plural(len(self.turns), 'turn')} "
            f"({with_usage} with provider usage)")
        say(f"  sidecar pid {pid} over stdio, summarizer {client.capabilities.get('summarizer')}; "
            f"{REPORT_POLICIES[self.report_usage]}")
        say(f"  storage {db} ({where})")
        if self.parsed.skipped:
            say(f"  {plural(len(self.parsed.skipped), 'transcript line')} skipped, e.g. {self.parsed.skipped[0]}")

    async def _turn(self, client: SidecarClient, turn: Turn, previous: Usage | None) -> Usage:
        """Ingest the user message, then each step as an agent makes it: assemble, report the call's usage, ingest
        the reply and its tool results.

        Any compaction a message starts finishes before the next one is sent (so long one-prompt runs compact
        mid-run), as for an agent whose summarizer is quicker than its steps: the same transcript and settings give
        the same timeline every run.
        """
        await self._ingest(client, turn.opening, first=previous is None)
        if previous is None:
            await self._columns(client)
        turn_cost: PromptCost | None = None
        sent: int | None = None
        for step in turn.steps:
            assembled = await self._assemble(client)  # the call that produced this step's assistant message
            sent = assembled.tokens if sent is None else sent
            turn_cost = self._price(assembled, turn_cost)
            if await self._report(client, turn, step, assembled):  # what the provider counted for that very call
                await self._settle(client)  # a compaction the report started, of the context that call sent
            await self._ingest(client, step, first=False)
            await self._settle(client)
        if sent is None:
            assembled = await self._assemble(client)
            sent, turn_cost = assembled.tokens, self._price(assembled, None)
        assert turn_cost is not None
        usage = await self._settle(client)
        self._line(turn, sent, turn_cost, usage, previous)
        return usage

    def _price(self, assembled: AssembleResult, turn: PromptCost | None) -> PromptCost:
        """Count one prompt in the cache model; added to the turn's prompts so far."""
        cost = self.cache.send(assembled.messages, [item.tokens for item in assembled.items])
        if turn is None:
            return cost
        return PromptCost(turn.tokens + cost.tokens, turn.repeated + cost.repeated, turn.kept,
                          turn.previous_tokens, turn.cost + cost.cost)

    async def _assemble(self, client: SidecarClient) -> AssembleResult:
        """context/assemble with the default budget, as the agent's next call."""
        clock = time.monotonic()
        assembled = await client.assemble(self.session_id)
        self.stats.assemble_s += time.monotonic() - clock
        self.stats.last_sent = (len(assembled.messages), assembled.tokens)
        return assembled

    async def _report(self, client: SidecarClient, turn: Turn, step: list[Message], call: AssembleResult) -> bool:
        """context/reportUsage with the step's provider usage, while it describes a prompt the sidecar sends;
        whether it was sent."""
        reported = provider_usage(step)
        if reported is None or self.report_usage == "never":
            return False
        if self.report_usage == "auto" and _reshaped(call):
            self.report_usage = "never"
            self.notes.append(f"from turn {turn.number} on, the transcript's provider usage is not reported: it "
                              "counts the original agent's prompt, and the sidecar now sends a pruned or compacted one")
            return False
        await client.report_usage(self.session_id, reported.get("input", 0), reported.get("output", 0),
                                  reported.get("cacheRead"), reported.get("cacheWrite"))
        self.stats.reports += 1
        return True

    async def _ingest(self, client: SidecarClient, messages: list[Message], first: bool) -> None:
        """memory/ingest; the first one also sets the session's window, model and title."""
        info = None
        if first:
            facts = self.parsed.session
            info = SessionInfo(context_window=self.context_window, model=facts.get("model"),
                               title=facts.get("title") or f"replay of {self.path.name}",
                               metadata=facts.get("metadata"))
        clock = time.monotonic()
        result = await client.ingest(self.session_id, messages, session=info)
        self.stats.ingest_s += time.monotonic() - clock
        self.stats.stored += len(result.ids) - result.duplicates
        self.stats.duplicates += result.duplicates

    async def _settle(self, client: SidecarClient) -> Usage:
        """Usage once any compaction the messages sent so far started has finished."""
        clock = time.monotonic()
        # The server handles a connection's messages in order and begins an automatic compaction in the handler
        # of the message that crossed the threshold, so this request already sees it running.
        usage = await client.usage(self.session_id)
        while usage.state == "compacting":
            if time.monotonic() - clock > SETTLE_TIMEOUT:
                message = f"compaction still running after {SETTLE_TIMEOUT:.0f} s"
                raise SidecarRequestError(codes.INTERNAL_ERROR, message)
            await asyncio.sleep(POLL_SECONDS)
            usage = await client.usage(self.session_id)
        self.stats.wait_s += time.monotonic() - clock
        return usage

    async def _columns(self, client: SidecarClient) -> None:
        """The session line and the timeline's column heads, once the session exists."""
        usage = await client.usage(self.session_id)
        window_from = "--context-window" if self.context_window else (self.parsed.session.get("model") or "default")
        say(f"  session {self.session_id}: window {usage.context_window:,} ({window_from}), "
            f"auto-compaction {self.mode} from {usage.threshold:,} tokens")
        say()
        say(" turn  +msgs   sent tokens  prefix   input cost   context after turn")

    def _compacted(self, params: DidCompactParams) -> None:
        self.pending.append(params)
        self.stats.compactions.append(params)

    def _counted(self, usage: Usage) -> None:
        self.stats.notifications += 1

    def _line(self, turn: Turn, sent: int, cost: PromptCost, usage: Usage, previous: Usage | None) -> None:
        changed = previous is not None and previous.state != usage.state
        note = f"   {previous.state} → {usage.state}" if changed and previous else ""
        if changed and usage.state in ("compact", "overflow") and not self.pending and usage.hint:
            self.notes.append(usage.hint)  # over the threshold with no compaction: the hint says why
        if not self.quiet or changed or self.pending or self.notes or previous is None:
            provider = " provider" if usage.source == "provider" else ""
            say(f" {turn.number:>4}  {len(turn.messages):>+5}  {sent:>12,}  {cost.share * 100:>5.1f}%  "
                f"{cost.cost:>11,.0f}   {usage.tokens:>8,} "
                f"{usage.percent:>5.1f}%  {usage.state}{provider}{note}")
        for event in self.pending:
            summaries = plural(len(event.summary_ids), "new summary", "new summaries")
            say(f"       ⤷ {event.trigger} {event.mode} compaction: {event.tokens_before:,} → "
                f"{event.tokens_after:,} tokens, {summaries} in context")
        for note in self.notes:
            say(f"       · {note}")
        self.pending.clear()
        self.notes.clear()

    def table(self, extra: list[tuple[str, str]]) -> None:
        """The summary table, with ``extra`` rows at its end."""
        assert self.finished is not None, "run() first"
        usage, seconds = self.finished
        stats = self.stats
        cache = self.cache
        uncached = f", {cache.cost / cache.uncached_cost:.2f}x the {cache.uncached_cost:,.0f} uncached" \
            if cache.uncached_cost else ""
        before = sum(c.tokens_before for c in stats.compactions)
        after = sum(c.tokens_after for c in stats.compactions)
        triggers = ", ".join(sorted({c.trigger for c in stats.compactions})) or "none"
        sent_messages, sent_tokens = stats.last_sent
        rows = [
            ("turns", f"{len(self.turns)}"),
            ("messages", f"{stats.stored} stored, {stats.duplicates} duplicates"),
            ("provider usage", f"{stats.reports} reports (context/reportUsage)"),
            ("compactions", f"{len(stats.compactions)} ({triggers})"
                            + (f", {before:,} → {after:,} tokens in all" if stats.compactions else "")),
            ("summaries", f"{usage.summaries}"),
            ("final context", usage_text(usage)),
            ("last assemble", f"{sent_messages} messages, {sent_tokens:,} tokens"),
            ("prefix hits", f"{hit_percent(cache)} of {cache.tokens:,} prompt tokens repeat the previous prompt's "
                            f"prefix; {cache.short} of {max(cache.prompts - 1, 0)} prompts repeat under half of the "
                            "one before"),
            ("input cost", f"{cache.cost:,.0f} at {cache.prices.text()} per token{uncached}"),
            ("usage pushes", f"{stats.notifications} context/didChangeUsage"),
            ("time", f"{seconds:.1f} s (ingest {stats.ingest_s:.1f} s, assemble {stats.assemble_s:.1f} s, "
                     f"usage and compaction waits {stats.wait_s:.1f} s)"),
            *extra,
        ]
        say()
        say("replay summary")
        width = max(len(name) for name, _ in rows)
        for name, value in rows:
            say(f"  {name:<{width}}  {value}")
