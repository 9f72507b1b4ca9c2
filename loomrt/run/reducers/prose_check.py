"""Checks on a recap or summary before it may replace a span.

"Not smaller" is no guard against a small model, which may answer the last message,
write a pleasantry, or restate one message of many. :func:`check_prose` rejects, with a
reason a person can read:

- an empty account;
- one that is mostly not about the span (few of its content words occur in the span);
- one that covers only one message of a span of many;
- one that answers the last message (or the user) instead of summarising;
- one that copies the prompt's worked example (a run of :data:`COPY_RUN` words of the example
  that the span and the task do not have).

Content words are lower-cased words of three or more letters or any token with a digit,
less a short list of English stopwords; the rules need no model and no answers. The words
an account reports with (asked, explained, provided, the user, the recap…) count for it
where the span has them too and not at all where it does not; an account of nothing else
says nothing of the span.
"""

from __future__ import annotations

import re

__all__ = ["check_prose", "content_words", "MIN_SHARE", "MANY", "COPY_RUN"]

_WORD = re.compile(r"[A-Za-z][A-Za-z'_-]{2,}|[A-Za-z0-9_./:-]*\d[A-Za-z0-9_./:-]*")
_STOP = frozenset(
    """the and for are but not you your yours with this that these those from have has had was were will
    would could should can may might must shall into onto over under about above below than then them they
    their there here what when where which who whom whose why how all any each few more most other some such
    only own same very just also its it's our ours out off once again further too been being does did doing
    done able like want wants need needs make made let lets get got yes okay sure please thanks thank well
    now one two her his him she he we us me my mine i'm i've i'd you're we're it is an as at be by do if in
    of on or so to up""".split()
)
_ANSWERING = re.compile(
    r"^\s*(sure|certainly|of course|absolutely|okay|ok|yes|no problem|great question|i'd be happy|i would be happy|"
    r"happy to help|here is|here's|hello|hi)\b[!,.:]?",
    re.IGNORECASE,
)
_ASKS_USER = re.compile(
    r"(what would you like|would you like me to|how can i help|let me know if|anything else|is there anything)",
    re.IGNORECASE,
)
_REPORTING = frozenset(
    """user user's assistant recap summary summarise summarize conversation transcript asked ask asks asking
    explain explained explains explaining explanation explanations provide provided provides providing
    calculate calculated calculating calculation calculations performed perform using used use result results
    mentioned mention discussed discuss described describe description requested request requests told said
    says stated confirmed noted agreed decided decision suggested suggest wanted gave give shared talked
    helped help question questions answer answered answers concept concepts definition definitions
    formula task next step steps open""".split()
)
_ROLES = frozenset({"user", "assistant", "tool"})
"""Every transcript line names its speaker: these words are in every span, so they never count."""
MIN_SHARE = 0.3
"""The least share of an account's content words that must occur in its span. (It was 0.35:
the embedded model's recap "The user asked me to explain the concepts of VPN, webhook, work
queue, and write amplification. I provided definitions for each concept…", four of its
span's topics named, scored 34% on the words a recap adds: asked, explain, concepts,
provided, definitions. An account about something else scores near 0.)"""
MANY = 4
"""A span of at least this many messages must be covered beyond one of them."""
COPY_RUN = 8
"""Words in a row shared with the worked example (and not with the span) that make a copy.
(Six flagged the embedded model's own recap "Recap: The user asked me to help with…",
which opens as the example's does.)"""
_ANY_WORD = re.compile(r"[A-Za-z0-9]+")


def _runs(text: str) -> set[tuple[str, ...]]:
    words = [w.lower() for w in _ANY_WORD.findall(text)]
    return {tuple(words[i : i + COPY_RUN]) for i in range(len(words) - COPY_RUN + 1)}


def content_words(text: str) -> set[str]:
    return {w for w in (t.lower().strip("'-_.:/") for t in _WORD.findall(text)) if w and w not in _STOP}


def check_prose(account: str, transcript: str, context: str = "", example: str = "") -> str | None:
    """None if ``account`` may stand for ``transcript`` (its lines ``[#seq] who: text``),
    else the reason it may not. Words of ``context`` (the task) count as on topic, though
    only the transcript's messages count as covered. ``example`` is the prompt's worked
    example, which the account must not copy."""
    if not account.strip():
        return "empty"
    if example and _runs(account) & (_runs(example) - _runs(f"{transcript}\n{context}")):
        return "it copies the worked example instead of the transcript"
    span_words = content_words(transcript) | content_words(context)
    words = {w for w in content_words(account) if w not in _ROLES and (w not in _REPORTING or w in span_words)}
    share = len(words & span_words) / len(words) if words else 0.0
    if _ANSWERING.match(account) or _ASKS_USER.search(account):
        if share < 0.6 or len(account) < 200:
            return "it answers the conversation instead of summarising it"
    if not words - _REPORTING:
        return "no content words: it says nothing about the span"
    if share < MIN_SHARE:
        return f"mostly not about the span (only {share:.0%} of its content words occur in it)"
    messages = [content_words(line) for line in transcript.splitlines() if line.strip()]
    messages = [m for m in messages if len(m) >= 3]
    if len(messages) >= MANY:
        covered = sum(1 for m in messages if len(words & m) >= min(3, max(2, len(m) // 10)))
        if covered <= 1:
            return f"it covers only one of the span's {len(messages)} messages"
    return None
