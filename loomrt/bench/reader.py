"""How the benchmarks' scripted model reads: rules any reader could apply without the answers.

The scripted model never looks at the gold values. To answer a question it looks for the
line of its prompt that shares the most *content words* with the question (lower-cased
words of three or more letters, less a short stop list); it answers from that line if the
line shares at least :data:`ANSWER_OVERLAP` of them, and otherwise, when it can, calls
Recall with the question's own words. A question that says whose thing it asks about
(``Tomas's room``) is answered only from a line naming that owner: a line about another
owner's room is not an answer, however many other words it shares. The grader (the
workload) then checks whether the gold value is in what it answered. A lossy summary that
keeps a related but wrong line makes the model answer wrongly, without Recall: the bench
can come out badly.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from functools import lru_cache

from loomrt.run.cards import EXPAND_LINE

__all__ = ["content_words", "owners", "lines_of", "best_line", "ANSWER_OVERLAP", "value_after_key", "STOP_WORDS"]

ANSWER_OVERLAP = 2
"""Content words a line must share with the question for the model to answer from it."""

_STOP = frozenset(
    """the and for that this with what was were are you your our has have had not but from
    they them their there then than into onto over about again also just only very can could
    would should will shall may might must did does done its it's his her him she he who whom
    which when where why how all any each some such more most other one two tell remind me
    please note let know thing things""".split()
)
STOP_WORDS = _STOP
"""Words a reader never searches by."""
_WORD = re.compile(r"[a-z0-9]+")
_POSSESSOR = re.compile(r"([a-z0-9]+)'s\b")
_SENTENCE = re.compile(r"(?<=[.!?])\s+|\n+|\\n|\"\s*[,}\]]\s*|[{\[]\s*\"")
"""Sentence ends, line breaks (also JSON-escaped ones) and JSON string boundaries."""


@lru_cache(maxsize=1)
def _stem() -> Callable[[str], str]:
    try:
        import Stemmer  # PyStemmer, a dependency of recall
    except ImportError:  # pragma: no cover - recall is a core dependency
        return lambda w: w
    return Stemmer.Stemmer("porter").stemWord  # type: ignore[no-any-return]


def content_words(text: str) -> set[str]:
    """The words of ``text`` that carry meaning: lower case, three letters or more, no stop
    words, Porter-stemmed (so *adopted* meets *adopt*)."""
    stem = _stem()
    return {stem(w) for w in _WORD.findall(text.lower()) if len(w) >= 3 and w not in _STOP}


def owners(question: str) -> set[str]:
    """The content words of ``question`` that name whose thing it asks about (the word
    before a possessive ``'s``), stemmed as :func:`content_words` stems them."""
    return content_words(" ".join(_POSSESSOR.findall(question.lower())))


def lines_of(texts: Iterable[str]) -> list[str]:
    """Every sentence or line of ``texts``, in order (the units a reader quotes from)."""
    out: list[str] = []
    for text in texts:
        out.extend(s.strip() for s in _SENTENCE.split(text) if s.strip())
    return out


def best_line(question: str, texts: Iterable[str]) -> tuple[str, int]:
    """The line sharing the most content words with ``question`` and how many it shares
    (the latest such line on a tie: what was said last is what a reader trusts). Questions
    (lines ending in ``?``) and a fold card's list of what it left out ("Expand for details
    about: ...") are not answers and are skipped, and so are lines that do not name the
    question's :func:`owners`."""
    want, whose = content_words(question), owners(question)
    best, score = "", 0
    for line in lines_of(texts):
        if line.endswith("?") or line.startswith(EXPAND_LINE):
            continue
        words = content_words(line)
        if not whose <= words:
            continue
        s = len(want & words)
        if s and s >= score:
            best, score = line, s
    return best, score


def value_after_key(line: str) -> str:
    """What a ``key: value`` line says after its last colon-and-space (the whole line if
    none), without the quotes of a JSON pair."""
    return (line.rsplit(": ", 1)[-1] if ": " in line else line).strip().strip("\"'")
