"""Secrets found in session text and replaced by a marker, for what a teammate can read of a team database.

The detectors are detect-secrets' (Yelp's library, imported on the first text that needs it: ~0.5 s): its
regular-expression plugins (provider, cloud and service keys and tokens), its keyword plugin (``password =
…``, ``API_KEY=…`` and other assignments, which makes ``.env`` lines secrets) run as on a config file, and its
Base64 entropy measure on long unquoted tokens. Two structures it only points at are redacted whole here: a PEM
private key block from its BEGIN line to its END line, and the value of an ``Authorization`` header.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterator
from typing import Any

MARKER = "[redacted secret: {kind}]"
"""What stands in a shared row where the owner's text has a secret."""
MIN_TOKEN = 20
"""Unquoted tokens shorter than this are not measured for entropy (identifiers, paths and words are short)."""
_AUTHORIZATION = re.compile(r"(?i)\b(?:proxy-)?authorization\b[\"']?\s*[:=]\s*[\"']?(?:(?:bearer|basic|token|digest|"
                            r"apikey)\s+)?([^\s\"',;}]{8,})")
_PEM = re.compile(r"-----BEGIN [A-Z0-9 ]*PRIVATE KEY(?: BLOCK)?-----.*?"
                  r"(?:-----END [A-Z0-9 ]*PRIVATE KEY(?: BLOCK)?-----|\Z)", re.DOTALL)
_TOKEN = re.compile(r"[A-Za-z0-9+/_\-.~]{%d,}={0,2}".replace("%d", str(MIN_TOKEN)))
_HEX_OR_UUID = re.compile(r"[0-9a-fA-F\-]+")
_PATTERN_GATE = re.compile(r"[A-Za-z0-9+=\-]{20,}|://[^\s/@:]+:[^\s/@]+@|_authToken|AKC|AP[\dA-F]")
"""What every one of detect-secrets' patterns needs (a long token, a URL's password, ...): most texts have none of
these, and the patterns themselves cost about a millisecond per text."""
_KEYWORD_HINTS = ("key", "pass", "pwd", "secret", "contras")
"""A text with none of these words has no assignment detect-secrets' keyword plugin finds (its DENYLIST)."""


class _Detectors:
    """detect-secrets' plugins, loaded once."""

    def __init__(self) -> None:
        from detect_secrets.core.plugins.util import get_mapping_from_secret_type_to_class
        from detect_secrets.plugins.base import RegexBasedDetector
        from detect_secrets.plugins.high_entropy_strings import Base64HighEntropyString
        from detect_secrets.plugins.ip_public import IPPublicDetector
        from detect_secrets.plugins.keyword import DENYLIST_REGEX, KeywordDetector
        from detect_secrets.plugins.private_key import PrivateKeyDetector

        self.patterns: list[tuple[str, re.Pattern[str]]] = []
        plugins: list[Any] = list(get_mapping_from_secret_type_to_class().values())
        for plugin_type in plugins:
            # An IP address is no secret; private keys are found whole, below.
            if issubclass(plugin_type, RegexBasedDetector) and plugin_type not in (PrivateKeyDetector,
                                                                                   IPPublicDetector):
                self.patterns += [(str(plugin_type.secret_type), pattern) for pattern in plugin_type().denylist]
        self.keyword = KeywordDetector()
        self.keyword_line = re.compile(DENYLIST_REGEX, re.IGNORECASE)
        self.entropy = Base64HighEntropyString()

    def spans(self, text: str) -> Iterator[tuple[int, int, str]]:
        """(start, end, kind) of every secret found in ``text``; may overlap."""
        lowered = text.lower()
        if "private key" in lowered:
            for match in _PEM.finditer(text):
                yield match.start(), match.end(), "private key"
        if "authorization" in lowered:
            for match in _AUTHORIZATION.finditer(text):
                yield match.start(1), match.end(1), "Authorization"
        for kind, pattern in self.patterns if _PATTERN_GATE.search(text) else ():
            for match in pattern.finditer(text):
                # A pattern's group is its secret when it is one (a URL's password); else the whole match is.
                group = match.lastindex or 0
                if group and len(match.group(group) or "") >= 8:
                    yield match.start(group), match.end(group), kind
                else:
                    yield match.start(), match.end(), kind
        if any(word in lowered for word in _KEYWORD_HINTS):
            offset = 0
            for line in text.splitlines(keepends=True):
                if self.keyword_line.search(line):
                    yield from self._keywords(line, offset)
                offset += len(line)
        for match in _TOKEN.finditer(text):
            token = match.group().strip(".-~=")
            if len(token) < MIN_TOKEN or _HEX_OR_UUID.fullmatch(token):
                continue  # commit hashes and uuids are everywhere in coding sessions and are no secret
            if self.entropy.calculate_shannon_entropy(token) > self.entropy.entropy_limit:
                start = match.start() + match.group().index(token)
                yield start, start + len(token), "high-entropy string"

    def _keywords(self, line: str, offset: int) -> Iterator[tuple[int, int, str]]:
        """Keyword assignments, read as a config file's (so unquoted values count, as in .env files)."""
        for found in self.keyword.analyze_line(filename="session.yaml", line=line.rstrip("\n"), line_number=0):
            value = found.secret_value or ""
            if len(value) >= 6:
                for match in re.finditer(re.escape(value), line):
                    yield offset + match.start(), offset + match.end(), "keyword"


_loaded: _Detectors | None = None
_lock = threading.Lock()


def _detectors() -> _Detectors:
    global _loaded
    with _lock:
        if _loaded is None:
            _loaded = _Detectors()
        return _loaded


def redact(text: str) -> str:
    """``text`` with every secret found replaced by a marker; the same object when there is none."""
    if len(text) < 6:
        return text
    spans = sorted(_detectors().spans(text))
    if not spans:
        return text
    merged: list[list[Any]] = []
    for start, end, kind in spans:
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end, kind])
    pieces: list[str] = []
    last = 0
    for start, end, kind in merged:
        pieces += [text[last:start], MARKER.format(kind=kind)]
        last = end
    pieces.append(text[last:])
    return "".join(pieces)


def redact_json(raw: str) -> str:
    """A JSON text with every string value in it redacted; the same object when nothing changed."""
    value = json.loads(raw)
    strings: list[str] = []
    _strings(value, strings)
    if not any(True for _ in _detectors().spans("\n".join(strings))):  # one pass over all of them
        return raw
    changed = _redact_value(value)
    if changed is value:
        return raw
    return json.dumps(changed, ensure_ascii=False, separators=(",", ":"))


def _strings(value: Any, into: list[str]) -> None:
    """Every string value (not key) in a JSON value."""
    if isinstance(value, str):
        into.append(value)
    elif isinstance(value, list):
        for item in value:
            _strings(item, into)
    elif isinstance(value, dict):
        for item in value.values():
            _strings(item, into)


def _redact_value(value: Any) -> Any:
    """The value with its strings redacted; the same object when none changed."""
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, list):
        items = [_redact_value(item) for item in value]
        return items if any(a is not b for a, b in zip(items, value, strict=True)) else value
    if isinstance(value, dict):
        pairs = {key: _redact_value(item) for key, item in value.items()}
        return pairs if any(pairs[key] is not item for key, item in value.items()) else value
    return value
