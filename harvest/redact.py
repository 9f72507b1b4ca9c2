"""Secrets never reach durable memory: they are redacted before a span is banked.

Matched by shape (API keys, tokens, private keys, ``password = ...`` assignments,
credentials in URLs); each is replaced by ``[redacted secret]``. A statement an extractor
writes that still carries one is dropped (:func:`has_secret`).
"""

from __future__ import annotations

import re

__all__ = ["REDACTED", "redact_secrets", "has_secret"]

REDACTED = "[redacted secret]"

_PATTERNS = [
    re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----.*?(?:-----END [A-Z ]*PRIVATE KEY-----|$)", re.S),
    re.compile(r"\b(?:sk|pk|rk)-(?:[A-Za-z0-9_-]{2,12}-)?[A-Za-z0-9_-]{16,}\b"),  # OpenAI / Anthropic / Stripe
    re.compile(r"\bAKIA[0-9A-Z]{16}\b"),  # AWS access key id
    re.compile(r"\bgh[pousr]_[A-Za-z0-9]{20,}\b"),  # GitHub
    re.compile(r"\bxox[abprs]-[A-Za-z0-9-]{10,}\b"),  # Slack
    re.compile(r"\bAIza[0-9A-Za-z_-]{30,}\b"),  # Google
    re.compile(r"\beyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\b"),  # a JWT
    re.compile(r"(?i)\bbearer\s+[A-Za-z0-9._~+/=-]{12,}"),
    re.compile(r"(?i)(?<=://)[^/\s:@]+:[^/\s@]+(?=@)"),  # user:password@ in a URL
    re.compile(
        r"(?i)\b(?:password|passwd|pwd|passphrase|secret|api[_ -]?key|access[_ -]?token|auth[_ -]?token|token)"
        r"\b(\s*(?:is|=|:)\s*)(?!\[redacted)[\"']?[^\s\"',;]{4,}[\"']?"
    ),
]


def _sub(pattern: re.Pattern[str], text: str) -> tuple[str, int]:
    if pattern.groups:  # keep the name and its "=", redact the value
        return pattern.subn(lambda m: m.group(0)[: m.end(1) - m.start(0)] + REDACTED, text)
    return pattern.subn(REDACTED, text)


def redact_secrets(text: str) -> tuple[str, int]:
    """``text`` with every secret replaced by :data:`REDACTED`, and how many there were."""
    total = 0
    for pattern in _PATTERNS:
        text, n = _sub(pattern, text)
        total += n
    return text, total


def has_secret(text: str) -> bool:
    """Whether ``text`` holds a secret (or a redaction mark standing for one)."""
    return REDACTED in text or any(p.search(text) for p in _PATTERNS)
