"""Placement: does a new fact restate a stored one, replace it, or stand alone?

A new fact **merges** into a stored one only when all three hold: the class matches, the
subjects share words (content-word Dice ≥ :data:`SUBJECT_DICE`), and the cosine between
the two statements clears the merge band (``loomrt memory calibrate`` measures it for the
configured embedder); and the exact values they carry (numbers, dates, times, quoted
words) agree. A fact that says the same as a stored one of its subject and class
apart from its values (the deploy window moved from 14:00 to 17:00), or a ``correction``,
**supersedes** the most similar stored fact once the cosine clears the lower supersede
band. Anything else is a new fact. Nothing is overwritten: a merge adds a source and a
history row; a supersession keeps the old row, marked.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from loomrt.recall.index import tokenize

__all__ = ["Placement", "Candidate", "dice", "values_of", "place", "SUBJECT_DICE", "MERGE_COSINE", "SUPERSEDE_COSINE"]

SUBJECT_DICE = 0.30
"""The least content-word overlap (Dice) between two subjects for a merge or a supersession."""

MERGE_COSINE = 0.80
"""The cosine a restatement must clear to merge (default; ``memory calibrate`` measures it)."""

SUPERSEDE_COSINE = 0.55
"""The cosine a changed value or a correction must clear to supersede a stored fact."""

SAME_WORDS = 0.6
"""A changed value supersedes only a statement that says the same apart from its values
(content-word Dice ≥ this with the values taken out): "Alice is 25" never supersedes
"Alice moved in 2020"."""

_VALUE = re.compile(r"\d+(?:[.:/-]\d+)*|\"[^\"]+\"|'[^']{2,}'")


def dice(a: str, b: str) -> float:
    """The Dice coefficient of the content words (stemmed, stopwords out) of ``a`` and ``b``."""
    x, y = set(tokenize(a)), set(tokenize(b))
    if not x or not y:
        return 0.0
    return 2 * len(x & y) / (len(x) + len(y))


def values_of(text: str) -> frozenset[str]:
    """The exact values ``text`` carries: numbers, dates, times, quoted words."""
    return frozenset(m.group(0).strip("\"'").lower() for m in _VALUE.finditer(text))


@dataclass(frozen=True)
class Candidate:
    """A stored live fact near the new one."""

    fact_id: str
    cls: str
    subject: str
    statement: str
    cosine: float


@dataclass(frozen=True)
class Placement:
    """Where a new fact goes: ``new``, ``merge`` into ``fact_id`` or ``supersede`` ``fact_id``."""

    action: str
    fact_id: str | None = None
    cosine: float | None = None
    why: str = ""


def place(
    cls: str,
    subject: str,
    statement: str,
    candidates: list[Candidate],
    *,
    merge_cosine: float = MERGE_COSINE,
    supersede_cosine: float = SUPERSEDE_COSINE,
) -> Placement:
    """Decide a new fact's placement against ``candidates`` (most similar first)."""
    mine = values_of(statement)
    for c in sorted(candidates, key=lambda c: -c.cosine):
        same_subject = dice(subject, c.subject) >= SUBJECT_DICE
        if not same_subject:
            continue
        if cls == "correction" and c.cosine >= supersede_cosine:
            return Placement("supersede", c.fact_id, c.cosine, "a correction of it")
        if c.cls != cls:
            continue
        agree = mine == values_of(c.statement)
        if c.cosine >= merge_cosine and agree:
            return Placement("merge", c.fact_id, c.cosine, "restates it")
        if (
            c.cosine >= supersede_cosine
            and not agree
            and (mine or values_of(c.statement))
            and dice(_VALUE.sub(" ", statement), _VALUE.sub(" ", c.statement)) >= SAME_WORDS
        ):
            return Placement("supersede", c.fact_id, c.cosine, "the same statement with other values")
    return Placement("new")
