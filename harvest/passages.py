"""The passage tier: banked spans kept as verbatim passages beside the facts.

Extraction by a small model misses most of what a later question needs (issue 48: the top
10 facts stated the answer for 9.2% of LoCoMo questions, the top 10 raw turns for 61%). So
every banked span is also kept as it was said: each user input and assistant reply of a
consolidated batch is a **passage**, a row of durable memory of class ``passage`` (its scope,
its words, who said them and when, and its provenance to record seqs), deduplicated by its
words within a scope (the same words said again add a source, not a row). Passages are
searched with the facts (:data:`TIERS`; memory search fuses both unless asked for one), so
what extraction missed is still found, in the original words; facts are the compact layer on
top. A passage is matched as a run's recall matches its evicted turns: as ``speaker: words``
(:func:`passage_label`), its words read with the line said before it (:data:`PASSAGE_FUSION`;
a reply is found by the question it answers). It keeps a reference to that line's passage
(``before`` in its first line: an id, never the words), so the words leave every passage's
search when theirs are erased. Passages never take part in placement (a fact never
merges into, or supersedes, a passage), and ``memory list`` and the fact counts leave them
out. Private material is never banked, and a message marked private later is left out at
consolidation (and erased by ``loomrt runs private``), so it is never a passage.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections import Counter
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from loomrt.harvest.db import row_lock
from loomrt.recall.index import Fusion

if TYPE_CHECKING:
    from loomrt.harvest.memory import MemoryStore, NewFact
    from loomrt.recall.memory import MemoryHit

__all__ = [
    "PASSAGE",
    "TIERS",
    "FACT_TIERS",
    "passage_key",
    "store_passages",
    "distinct_hits",
    "classes_of",
    "MIN_CHARS",
    "said_words",
    "passage_id",
    "is_passage_id",
    "matched_as",
    "passage_label",
    "PASSAGE_FUSION",
]

PASSAGE = "passage"
"""The class of a passage row in ``memory_facts``."""
TIERS = ("facts", "passages")
"""What memory search may read: the extracted facts, the verbatim passages, or both (fused)."""
FACT_TIERS = ("facts",)
MIN_CHARS = 8
"""A line shorter than this ("ok", "thanks!") is no passage."""


PASSAGE_FUSION = Fusion(dense=0.5, lexical=0.0, lexical_window=1.0, lexical_context=0.0)
"""How a passage is scored: cosine with ``speaker: words``, and BM25 on its window (the line
said before it, then ``speaker: words``), as a run's recall weighs an evicted turn's window
(:class:`~loomrt.recall.index.Fusion`'s defaults) without the signals a row of its own cannot
carry (the turns around it). Measured in docs/benchmarks.md ("Passages matched as turns")."""


def passage_label(speaker: str, text: str) -> str:
    """A passage as it is matched (and embedded): ``speaker: words``."""
    return f"{speaker}: {text}" if speaker else text


def passage_id(key: str) -> str:
    """The row id of the passage with :func:`passage_key` ``key`` (fact ids begin with ``m``)."""
    return "p" + hashlib.sha256(key.encode()).hexdigest()[:11]


def matched_as(cls: str, subject: str, statement: str, lines: str | None) -> tuple[str, str | None]:
    """What a stored row (its class, subject, statement and lines as JSON) is matched as: its
    label, and the id of the passage said before it (a fact: its statement, and None)."""
    if cls != PASSAGE:
        return statement, None
    first = (json.loads(lines or "[]") or [{}])[0]
    before = first.get("before") if isinstance(first, dict) else None
    return passage_label(subject, statement), before if isinstance(before, str) else None


def is_passage_id(fact_id: str) -> bool:
    """Whether a row id is a passage's (:func:`passage_id`)."""
    return fact_id.startswith("p")


def said_words(text: str) -> str:
    """Words as repeats are told apart: lower case, without punctuation."""
    return " ".join(re.findall(r"\w+", text.casefold()))


def passage_key(scope: str, text: str) -> str:
    """The key that keeps one passage per words and scope."""
    return f"{PASSAGE}:{scope}:{hashlib.sha256(said_words(text).encode()).hexdigest()[:16]}"


def store_passages(
    memory: MemoryStore, conn: Any, passages: Sequence[NewFact], vectors: np.ndarray | None, now: float
) -> Counter[str]:
    """Inside a write transaction: store ``passages`` (``vectors``: theirs, in order), each
    once per its words and scope (the same words again add their line and source to the
    stored passage; a retried batch adds nothing); counts ``new`` and ``kept_once``."""
    counts: Counter[str] = Counter()
    fresh: dict[str, tuple[NewFact, list[dict[str, Any]], list[dict[str, Any]], np.ndarray | None]] = {}
    for i, p in enumerate(passages):
        if p.key in fresh:  # the same words again in this batch: their line joins the first
            counts["kept_once"] += 1
            _, lines, sources = fresh[p.key][:3]
            if new_lines(lines, p.lines):
                lines += new_lines(lines, p.lines)
                sources += p.sources
            continue
        row = conn.execute("SELECT fact_id FROM memory_keys WHERE key = ?", (p.key,)).fetchone()
        if row is None:
            fresh[p.key] = (p, list(p.lines), list(p.sources), vectors[i] if vectors is not None else None)
            continue
        counts["kept_once"] += 1
        stored = conn.execute(
            f"SELECT sources, lines, status FROM memory_facts WHERE fact_id = ?{row_lock(memory.db)}",
            row,
        ).fetchone()
        if stored is None or stored[2] != "live":
            continue  # forgotten or erased: the operator's decision stands
        kept = json.loads(stored[1] or "[]")
        added = new_lines(kept, p.lines)
        if added:  # (a retried batch adds nothing: its lines are there)
            conn.execute(
                "UPDATE memory_facts SET sources = ?, lines = ? WHERE fact_id = ? AND status = 'live'",
                (
                    json.dumps([*json.loads(stored[0]), *p.sources]),
                    json.dumps([*kept, *added], ensure_ascii=False),
                    row[0],
                ),
            )
    for p, lines, sources, vec in fresh.values():
        fact_id = passage_id(p.key)
        before = lines[0].get("before") if lines else None
        memory._insert(
            conn,
            (fact_id, p.scope, PASSAGE, p.subject, p.statement, p.observed_at, now, json.dumps(sources)),
            vec,
            lines=lines,
            label=passage_label(p.subject, p.statement),
            before=before if isinstance(before, str) and before != fact_id else None,
        )
        conn.execute("INSERT INTO memory_keys VALUES (?, ?, 'passage')", (p.key, fact_id))
        counts["new"] += 1
    return counts


def new_lines(kept: Sequence[dict[str, Any]], lines: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Those of ``lines`` not already among ``kept`` (by run and seq)."""
    seen = {(line.get("run_id"), line.get("seq")) for line in kept}
    return [line for line in lines if (line.get("run_id"), line.get("seq")) not in seen]


def classes_of(tiers: Sequence[str]) -> str | None:
    """Which rows ``tiers`` reads: None (facts and passages), ``passage``, or ``fact`` (every
    class but passages); a tier not in :data:`TIERS` is an error."""
    unknown = [t for t in tiers if t not in TIERS]
    if unknown or not tiers:
        raise ValueError(f"unknown memory tier(s) {unknown or list(tiers)}: expected {', '.join(TIERS)}")
    return None if set(tiers) == set(TIERS) else PASSAGE if "facts" not in tiers else "fact"


def distinct_hits(hits: Sequence[MemoryHit], top_k: int) -> list[MemoryHit]:
    """``hits`` (best first) without a passage whose words a better hit states already (the
    echo of a fact extracted verbatim), the best ``top_k``."""
    seen: set[str] = set()
    out = []
    for hit in hits:
        words = said_words(hit.text)
        if words in seen:
            continue
        seen.add(words)
        out.append(hit)
    return out[:top_k]
