"""Standing rules: sentences of user and system messages that every summary replacing them carries verbatim.

A summarizer may drop an instruction; this footer cannot. A rule is a sentence (a line, split at sentence
ends, outside code fences) that says must, never, always, don't, do not, make sure, important, ensure, be
sure, under no circumstances or at no point, is not a question, and is at most ``MAX_RULE_CHARS`` long.
A summary carries at most ``MAX_RULES`` rules of ``MAX_RULES_CHARS`` characters in all: the earliest
stated are kept, the rest are listed as left out (``memory/describe``'s ``rulesLeftOut``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable

MAX_RULE_CHARS = 400
"""A longer sentence is prose or pasted output, not a standing rule."""
MAX_RULES = 40
MAX_RULES_CHARS = 6000
_RULE = re.compile(r"\b(?:must|never|always|don'?t|do not|make sure|important|ensure|be sure"
                   r"|under no circumstances|at no point)\b", re.I)
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=\S)")
_BULLET = re.compile(r"^(?:[-*•>]\s+|\d+[.)]\s+)")
_SECTION = re.compile(r"\n*<rules>\n(.*?)\n?</rules>", re.S)


def rule_sentences(text: str) -> list[str]:
    """The sentences of ``text`` that state a rule, verbatim, in order."""
    found: list[str] = []
    fenced = False
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("```"):
            fenced = not fenced
            continue
        if fenced or not stripped:
            continue
        for sentence in _SENTENCE_END.split(_BULLET.sub("", stripped)):
            sentence = sentence.strip()
            if (sentence and len(sentence) <= MAX_RULE_CHARS and not sentence.endswith("?")
                    and _RULE.search(sentence)):
                found.append(sentence)
    return found


def carry(rules: Iterable[str], left_out: Iterable[str] = ()) -> tuple[list[str], list[str]]:
    """(kept, left out): ``rules`` deduplicated in order and capped; ``left_out`` are sources' earlier ones."""
    kept: list[str] = []
    dropped: list[str] = []
    seen: set[str] = set()
    chars = 0
    for rule in rules:
        key = " ".join(rule.split()).casefold()
        if key in seen:
            continue
        seen.add(key)
        if len(kept) < MAX_RULES and chars + len(rule) <= MAX_RULES_CHARS:
            kept.append(rule)
            chars += len(rule)
        else:
            dropped.append(rule)
    for rule in left_out:
        key = " ".join(rule.split()).casefold()
        if key not in seen:
            seen.add(key)
            dropped.append(rule)
    return kept, dropped


def render_rules(rules: Iterable[str]) -> str:
    """The ``<rules>`` footer, or nothing when there are none."""
    lines = "\n".join(rules)
    return f"<rules>\n{lines}\n</rules>" if lines else ""


def footer_rules(text: str | None) -> list[str]:
    """Rules listed in a summary's footer (for summaries stored without the rules column)."""
    match = _SECTION.search(text or "")
    return [line for line in match.group(1).splitlines() if line.strip()] if match else []
