"""The extractive summarizer used when no LLM is configured, and the shared truncation helper."""

from __future__ import annotations

import asyncio
import functools
import re
from collections.abc import Iterable, Sequence

import attrs

from sidecar.engine.tokens import BYTES_PER_TOKEN, estimate_text_tokens
from sidecar.summarizers.base import SourceText, SummaryRequest
from sidecar.summarizers.prompts import HANDOFF_SECTIONS

_INSTRUCTION = re.compile(
    r"\b(?:must|never|always|don'?t|do not|should|shall|make sure|ensure|required?|need to|needs to"
    r"|have to|avoid|only|please|prefer)\b", re.I)
_IMPERATIVE = re.compile(
    r"^(?:please\s+|now\s+|also\s+|then\s+|and\s+)?(?:add|use|make|keep|write|fix|implement|create|remove"
    r"|delete|rename|run|test|update|change|ensure|avoid|do|don'?t|never|always|put|move|read|check|return"
    r"|call|build|commit|refactor|replace|support|handle|skip|stop|start|set|prefer|try|let'?s|document|port"
    r"|split|merge|rewrite|convert|drop|install|configure|look|find|show|explain|investigate|debug)\b", re.I)
_DECISION = re.compile(
    r"\b(?:decided|decide|decision|we'll|we will|instead|because|chose|choose|chosen"
    r"|going with|go with|opted|switch(?:ed)? to|rather than|settled on|the plan is|approach)\b", re.I)
_ERROR = re.compile(
    r"\b(?:errors?|exception|traceback|failed|fails|failing|failure|fatal|panic|segfault|not found"
    r"|no such file|denied|refused|timed out|assertionerror)\b", re.I)
_PROGRESS = re.compile(
    r"\b(?:done|fixed|added|implemented|created|wrote|written|updated|refactored|removed|renamed|passed"
    r"|passes|passing|works|completed|finished|merged|committed|moved|installed|resolved)\b", re.I)
_NEXT = re.compile(
    r"\b(?:next|todo|to do|remaining|still need|need to|needs to|going to|plan to|follow[- ]up"
    r"|afterwards|not yet)\b", re.I)
_BLOCKER = re.compile(
    r"\b(?:blocked|blocker|stuck|cannot|can't|unable|waiting (?:for|on)|no way to|open question)\b", re.I)
_CHANGE_VERB = re.compile(
    r"\b(?:edited|modified|changed|created|updated|wrote|deleted|renamed|patched|fixed|added|removed"
    r"|rewrote|refactored)\b", re.I)
_RESOLVED = re.compile(r"\b(?:fixed|resolved|passes|passing|pass now|works now|succeeded|green)\b", re.I)
_WRITE_CALL = re.compile(
    r"\b(?:write|edit|multi_?edit|str_replace\w*|apply_patch|create\w*|patch|delete\w*|remove\w*"
    r"|rename\w*|move\w*|notebook_edit)\s*\(", re.I)
_PATH_KEY = re.compile(r'"(?:path|file_path|filePath|filename|file|target_file|new_path)"\s*:\s*"([^"\\]+)"')
_PATCH_HEADER = re.compile(r"^(?:\*\*\* (?:Add|Update|Delete) File: |\+\+\+ b/)(\S+)", re.M)
_TOOL_CALL = re.compile(r"\b\w+\(\{")
_SLASH_COMMAND = re.compile(r"^/\S+$")
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z0-9\"'`(\[*])")
_BULLET = re.compile(r"^(?:[-*•]\s+|\d+[.)]\s+)")
_HEADING = re.compile(r"^#{1,6}\s")
_URL = re.compile(r"\b[a-z][a-z0-9+.-]*://\S+", re.I)
_PATH_TOKEN = re.compile(r"[\w@+~./-]+")
_EXTENSIONS = frozenset(re.findall(r"\w+",
    "py pyi pyx js mjs cjs ts tsx jsx json jsonl toml yaml yml md rst txt cfg ini conf lock sh bash zsh fish"
    " ps1 bat rs go java kt kts scala c h cc cpp hpp cxx cs rb php pl lua vim el clj ex exs erl hs ml swift"
    " mm jl sql html htm css scss sass less vue svelte xml csv tsv ipynb proto gradle mk cmake env tf hcl"
    " nix zig dart duckdb db sqlite log"))
_BARE_FILES = frozenset({"Makefile", "Dockerfile", "Justfile", "Procfile", "Gemfile", "Rakefile"})
_STOPWORDS = frozenset(re.findall(r"\w+", "the and for with that this from into about what when then"))
_JSON_ESCAPE = re.compile(r'\\(u[0-9a-fA-F]{4}|["\\/bfnrt])')
_UNESCAPED = {"n": "\n", "t": "\t", "r": "\r", "b": " ", "f": " ", '"': '"', "\\": "\\", "/": "/"}


def decoded(text: str) -> str:
    """``text`` with JSON string escapes undone: tool-call arguments appear in message text as JSON, where
    a newline before a path reads ``\\nmain.ts``."""
    if "\\" not in text:
        return text
    return _JSON_ESCAPE.sub(_unescape, text)


def _unescape(match: re.Match[str]) -> str:
    escape = match.group(1)
    if escape[0] != "u":
        return _UNESCAPED[escape]
    code = int(escape[1:], 16)
    return " " if 0xD800 <= code <= 0xDFFF else chr(code)  # a lone surrogate cannot be stored


def truncation_marker(target_tokens: int) -> str:
    """The visible marker that ends a truncated text."""
    return f"[… truncated to ~{target_tokens} tokens]"


def truncate_to_tokens(text: str, target_tokens: int) -> str:
    """``text`` cut to ``target_tokens`` at a line, sentence or word boundary, with the marker."""
    text = text.strip()
    if estimate_text_tokens(text) <= target_tokens:
        return text
    marker = truncation_marker(target_tokens)
    budget = target_tokens - estimate_text_tokens("\n" + marker)
    if budget <= 0:
        return marker
    head = text.encode("utf-8")[: budget * BYTES_PER_TOKEN].decode("utf-8", "ignore")
    cut = _boundary(head)
    return f"{head[:cut].rstrip()}\n{marker}" if cut > 0 else marker


def _boundary(head: str) -> int:
    """Where to cut ``head``: the last line end, else sentence end, else word end that keeps enough."""
    line, word = head.rfind("\n"), head.rfind(" ")
    sentence = max((m.end() for m in re.finditer(r"[.!?](?=\s)", head)), default=-1)
    for cut in (line, sentence, word):
        if cut >= len(head) // 2:
            return cut
    return max(line, sentence, word, 0) or len(head)


def extract_paths(text: str) -> list[str]:
    """File paths mentioned in ``text``, in order of first mention."""
    found: dict[str, None] = {}
    for token in _PATH_TOKEN.findall(_URL.sub(" ", decoded(text))):
        token = token.rstrip(".").strip("-")
        if _looks_like_path(token):
            found.setdefault(token, None)
    return list(found)


def _looks_like_path(token: str) -> bool:
    if not re.search(r"[A-Za-z]", token) or "//" in token or token in {"/", "./", "~/", "../"}:
        return False
    last = token.rstrip("/").rsplit("/", 1)[-1]
    ext = last.rsplit(".", 1)[-1].lower() if "." in last.strip(".") else ""
    if "/" not in token:
        return token in _BARE_FILES or (ext in _EXTENSIONS and bool(last.rsplit(".", 1)[0]))
    return (token.startswith(("~/", "./", "../")) or token.count("/") >= 2
            or ext in _EXTENSIONS or token.endswith("/"))


def changed_paths(text: str) -> list[str]:
    """Paths that ``text`` shows being written: write/edit tool calls, patch headers, "edited x" lines."""
    text = decoded(text)
    found: dict[str, None] = {}
    for call in _WRITE_CALL.finditer(text):
        key = _PATH_KEY.search(text, call.end(), call.end() + 400)
        if key:
            found.setdefault(key.group(1), None)
    for header in _PATCH_HEADER.finditer(text):
        found.setdefault(header.group(1), None)
    for unit in _units(text):
        verb = _CHANGE_VERB.search(unit)
        if verb and not _ERROR.search(unit):
            # Only the first path after the verb: the others are usually context ("as docs/x.md says").
            for path in extract_paths(unit[verb.end():])[:1]:
                found.setdefault(path, None)
    return list(found)


def _units(text: str) -> list[str]:
    """Sentences of ``text``: its non-empty lines, long lines split at sentence ends."""
    units: list[str] = []
    for line in text.splitlines():
        line = _BULLET.sub("", line.strip())
        if line and not _HEADING.match(line):
            units.extend(piece for piece in _SENTENCE_END.split(line) if piece.strip())
    return units


def _clip(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    cut = text.rfind(" ", 0, limit - 1)
    return text[: cut if cut > limit // 2 else limit - 1].rstrip() + "…"


def _focus_words(focus: str | None) -> tuple[str, ...]:
    words = re.findall(r"[\w./-]{3,}", (focus or "").lower())
    return tuple(dict.fromkeys(w for w in words if w not in _STOPWORDS))


def _matches(text: str, words: Sequence[str]) -> bool:
    lowered = text.lower()
    return any(word in lowered for word in words)


def _role(label: str) -> str:
    roles = ("user", "assistant", "tool", "summary", "system")
    return next((role for role in roles if label.lower().startswith(role)), "other")


def _dedupe(items: Iterable[str]) -> list[str]:
    seen: dict[str, str] = {}
    for item in items:
        seen.setdefault(re.sub(r"\W+", " ", item.lower()).strip(), item)
    return [item for key, item in seen.items() if key]


@attrs.define(frozen=True)
class _Level:
    """One level of detail: items per section or sentences per source, and characters per item."""

    items: int
    chars: int


_HANDOFF_LEVELS: tuple[_Level, ...] = (_Level(1000, 400), _Level(12, 300), _Level(8, 220), _Level(5, 160),
                                      _Level(3, 120), _Level(2, 90), _Level(1, 70), _Level(1, 40))
_DIGEST_LEVELS: tuple[_Level, ...] = (_Level(4, 300), _Level(3, 220), _Level(2, 160), _Level(1, 120), _Level(1, 80))
_AGGRESSIVE_START = {"handoff": 4, "digest": 3}
_INLINE_CHARS = 256 * 1024  # above this much source text, summarize in a thread: the event loop keeps serving


class DeterministicSummarizer:
    """Extractive summaries without an LLM: instructions, paths, decisions, errors and the latest state."""

    name = "deterministic"

    async def summarize(self, request: SummaryRequest) -> str:
        """The summary text; never empty when there are sources."""
        if sum(len(source.text) for source in request.sources) > _INLINE_CHARS:
            return await asyncio.to_thread(self.summarize_now, request)
        return self.summarize_now(request)

    def summarize_now(self, request: SummaryRequest) -> str:
        """The same summary, computed synchronously."""
        target = max(1, request.target_tokens)
        aim = max(1, target * 6 // 10) if request.aggressive else target
        words = _focus_words(request.focus)
        if request.kind == "handoff":
            sections = _handoff_sections(request)
            levels, start = _HANDOFF_LEVELS, _AGGRESSIVE_START["handoff"]
            render = functools.partial(_render_handoff, sections, words=words)
        else:
            entries, paths = _digest_entries(request, words)
            levels, start = _DIGEST_LEVELS, _AGGRESSIVE_START["digest"]
            render = functools.partial(_render_digest, entries, paths, words=words)
        text = ""
        for level in levels[start:] if request.aggressive else levels:
            text = render(level)
            if estimate_text_tokens(text) <= aim:
                return text
        return truncate_to_tokens(text, aim)


@attrs.define(frozen=True)
class _Entry:
    """One source of a digest: its (position, sentence) pairs best first, the extra sentences it gets
    (the latest assistant message), and whether it is quiet (dropped at the tersest levels)."""

    heading: str
    ranked: tuple[tuple[int, str], ...]
    bonus: int
    quiet: bool


def _digest_entries(request: SummaryRequest, words: Sequence[str]) -> tuple[list[_Entry], list[str]]:
    """The digest entries and every path the sources mention."""
    previous = re.sub(r"\s+", " ", (request.previous_summary or "").lower())
    last_assistant = max((i for i, s in enumerate(request.sources) if _role(s.label) == "assistant"),
                         default=-1)
    entries, paths = [], []
    for index, source in enumerate(request.sources):
        paths.extend(extract_paths(source.text))
        ranked, best = _rank(source, words, previous)
        if not ranked:
            continue
        when = f" @ {_short_time(source.at)}" if source.at else ""
        quiet = best <= 1 and _role(source.label) == "tool" and index != len(request.sources) - 1
        entries.append(_Entry(f"- {source.label}{when}: ", ranked, int(index == last_assistant), quiet))
    return entries, list(dict.fromkeys(paths))


def _render_digest(entries: list[_Entry], paths: list[str], level: _Level, words: Sequence[str]) -> str:
    """A chronological digest: one line per source with its most telling sentences."""
    lines = []
    for entry in entries:
        if entry.quiet and level.items <= 1:
            continue
        picked = sorted(entry.ranked[: level.items + entry.bonus])
        lines.append(entry.heading + " ".join(_clip(unit, level.chars) for _, unit in picked))
    shown = max(3, level.items * 4)
    more = f" (+{len(paths) - shown} more)" if len(paths) > shown else ""
    files = [f"Files: {', '.join(paths[:shown])}{more}"] if paths else []
    focused = [line for line in lines if words and _matches(line, words)]
    rest = [line for line in lines if not (words and _matches(line, words))]
    return "\n".join(focused + files + rest) or "(no content)"


def _rank(source: SourceText, words: Sequence[str], previous: str) -> tuple[tuple[tuple[int, str], ...], int]:
    """The sentences of a source, most telling first, and the best score."""
    role = _role(source.label)
    units = _units(source.text)
    fresh = [u for u in units if len(u) < 24 or re.sub(r"\s+", " ", u.lower()) not in previous]
    units = fresh or units
    base = {"user": 3, "system": 3, "summary": 2, "assistant": 1}.get(role, 0)
    scored = []
    for position, unit in enumerate(units):
        score = base + (1 if position == 0 else 0)
        score += 10 if words and _matches(unit, words) else 0
        if role in ("user", "system") and _is_instruction(unit):
            score += 3
        score += 2 * bool(_DECISION.search(unit)) + 2 * bool(_ERROR.search(unit))
        score += bool(extract_paths(unit)) + bool(_PROGRESS.search(unit)) + bool(_NEXT.search(unit))
        scored.append((-score, position, unit))
    scored.sort()
    return tuple((position, unit) for _, position, unit in scored), (-scored[0][0] if scored else 0)


def _is_goal(units: list[str]) -> bool:
    """Whether a user message can state a goal: not empty, not a bare slash command."""
    return bool(units) and not (len(units) == 1 and _SLASH_COMMAND.match(units[0]))


def _is_instruction(unit: str) -> bool:
    return not unit.rstrip().endswith("?") and bool(_INSTRUCTION.search(unit) or _IMPERATIVE.match(unit))


def _short_time(at: str) -> str:
    return at.replace("T", " ")[:16]


def _handoff_sections(request: SummaryRequest) -> dict[str, list[str]]:
    """The items of the eight handoff sections, merged over the previous handoff when there is one."""
    previous, sources = _parse_handoff(request.previous_summary), list(request.sources)
    if request.previous_summary and not previous:
        sources.insert(0, SourceText(label="summary (previous handoff)", text=request.previous_summary))
    found = _extract(sources)
    old_files = previous.get("Files Changed", [])
    if old_files:
        also = [i for i in [*old_files, *found["Files Changed"]] if i.startswith(_ALSO)]
        paths = [p for i in also for p in i[len(_ALSO):].split(", ") if not p.endswith("…")]
        changed = [i for i in [*old_files, *found["Files Changed"]] if not i.startswith(_ALSO)]
        found["Files Changed"] = _files_items(changed, paths)
        previous["Files Changed"] = []
    sections: dict[str, list[str]] = {}
    for title in HANDOFF_SECTIONS:
        old, new = previous.get(title, []), found.get(title, [])
        if title == "Goal":
            items = old or new
        elif title in ("Key Instructions", "Progress", "Key Decisions", "Files Changed"):
            items = old + new
        else:
            items = new or old
        sections[title] = _dedupe(items)
    return sections


def _extract(sources: Sequence[SourceText]) -> dict[str, list[str]]:
    """Handoff section items found in the sources."""
    out: dict[str, list[str]] = {title: [] for title in HANDOFF_SECTIONS}
    changed: list[str] = []
    mentioned: list[str] = []
    errors: list[tuple[int, str]] = []
    for index, source in enumerate(sources):
        role, units = _role(source.label), _units(source.text)
        changed.extend(changed_paths(source.text))
        mentioned.extend(extract_paths(source.text))
        if role in ("user", "system"):
            if not out["Goal"] and role == "user" and _is_goal(units):
                out["Goal"] = [" ".join(units[:2])]
            out["Key Instructions"].extend(u for u in units if _is_instruction(u))
        for unit in units:
            if _ERROR.search(unit):
                errors.append((index, f"{source.label}: {unit}"))
            if role == "tool" or _TOOL_CALL.search(unit):
                continue
            if _DECISION.search(unit):
                out["Key Decisions"].append(unit)
            if role in ("assistant", "summary") and _PROGRESS.search(unit) and not _ERROR.search(unit):
                out["Progress"].append(unit)
    if not out["Goal"] and sources:
        out["Goal"] = [" ".join(_units(sources[0].text)[:2]) or sources[0].label]
    out["Files Changed"] = _files_items(changed, mentioned)
    out.update(_latest(sources, errors))
    return out


_ALSO = "Also referenced: "


def _files_items(changed: list[str], mentioned: list[str]) -> list[str]:
    """The changed paths, one per item, then one item naming the other paths."""
    changed = list(dict.fromkeys(changed))
    others = [p for p in dict.fromkeys(mentioned) if p not in changed]
    return changed + ([_ALSO + ", ".join(others)] if others else [])


def _latest(sources: Sequence[SourceText], errors: list[tuple[int, str]]) -> dict[str, list[str]]:
    """Current State, Blockers and Next Steps, from the newest sources."""
    talk = [(i, s) for i, s in enumerate(sources) if _role(s.label) in ("user", "assistant", "summary")]
    state: list[str] = []
    assistants = [s for _, s in talk if _role(s.label) == "assistant"]
    if assistants:
        state.append(" ".join(_units(assistants[-1].text)[:3]))
    if sources and _role(sources[-1].label) == "tool":
        state.append(f"Last {sources[-1].label}: {(_units(sources[-1].text) or ['(empty)'])[0]}")
    recent_from = max(0, len(sources) - max(4, len(sources) // 4))
    resolved = [i for i, s in talk if _role(s.label) == "assistant" and _RESOLVED.search(s.text)]
    if resolved:
        recent_from = max(recent_from, resolved[-1] + 1)
    blockers = [e for i, e in errors if i >= recent_from]
    blockers += [u for _, s in talk[-3:] for u in _units(s.text) if _BLOCKER.search(u)]
    steps: list[str] = []
    if talk and _role(talk[-1][1].label) == "user":
        steps.append(f"Answer the latest user request: {' '.join(_units(talk[-1][1].text)[:2])}")
    steps += [u for _, s in talk[-2:] for u in _units(s.text) if _NEXT.search(u) and not _TOOL_CALL.search(u)]
    users = [s for _, s in talk if _role(s.label) == "user" and _is_goal(_units(s.text))]
    if not steps and users:
        steps.append(f"Continue with the latest user request: {' '.join(_units(users[-1].text)[:2])}")
    return {"Current State": [s for s in state if s], "Blockers": blockers, "Next Steps": steps}


def _parse_handoff(text: str | None) -> dict[str, list[str]]:
    """The items of each section of a handoff summary; empty unless it has our headings."""
    sections: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in (text or "").splitlines():
        stripped = line.strip()
        title = stripped[3:].strip() if stripped.startswith("## ") else None
        if title in HANDOFF_SECTIONS:
            current = sections.setdefault(title, [])
        elif stripped.startswith(("#", "<")):
            current = None
        elif current is not None and stripped:
            item = _BULLET.sub("", stripped)
            if not item.lower().startswith(("none noted", "… (")):
                current.append(item)
    return sections


def _render_handoff(sections: dict[str, list[str]], level: _Level, words: Sequence[str]) -> str:
    keep_newest = {"Progress", "Key Decisions", "Blockers"}
    blocks = []
    for title in HANDOFF_SECTIONS:
        items = sorted(sections.get(title, []), key=lambda item: not _matches(item, words))
        cap = level.items * 2 if title == "Key Instructions" else level.items
        cap = 1 if title == "Goal" else cap
        dropped = max(0, len(items) - cap)
        if dropped:
            items = items[-cap:] if title in keep_newest and not words else items[:cap]
        chars = level.chars * 2 if title == "Goal" else level.chars
        lines = [f"- {_clip(item, chars)}" for item in items] or ["- None noted."]
        if dropped:
            lines.append(f"- … ({dropped} more omitted)")
        blocks.append(f"## {title}\n" + "\n".join(lines))
    return "\n\n".join(blocks)
