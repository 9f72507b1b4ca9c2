"""A durable-memory fact as it is written (:class:`NewFact`), as it is stored
(:class:`Fact`), and as a reader gets it (:func:`hit_of`): the records both backends share
(:mod:`loomrt.harvest.memory`, :mod:`loomrt.harvest.pg_memory`)."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

from loomrt.harvest.evidence import best_line, said_of
from loomrt.recall.memory import MemoryHit

__all__ = ["NewFact", "Fact", "fact_key", "hit_of"]


def fact_key(batch_id: str, statement: str) -> str:
    """The idempotency key of a statement extracted from a batch."""
    return f"{batch_id}:{hashlib.sha256(statement.strip().encode()).hexdigest()[:16]}"


@dataclass(frozen=True)
class NewFact:
    """A statement to store (as the extractor wrote it, checked)."""

    statement: str
    cls: str
    subject: str
    scope: str
    key: str
    """:func:`fact_key` of its batch and text."""
    observed_at: str | None = None
    sources: list[dict[str, Any]] = field(default_factory=list)
    """Where it came from: ``{run_id, seqs, distillation_seq, agent, def_hash, batch_id}``."""
    lines: list[dict[str, Any]] = field(default_factory=list)
    """The source lines, verbatim (:func:`~loomrt.harvest.evidence.stored_line`)."""
    model: str | None = None
    """The model that extracted it (None: not extracted)."""
    author: str = "run"
    """Who wrote it: ``run`` (extracted from what a run said) or ``operator`` (written by hand)."""


@dataclass(frozen=True)
class Fact:
    """A stored fact."""

    fact_id: str
    scope: str
    cls: str
    subject: str
    statement: str
    observed_at: str | None
    created_at: float
    sources: list[dict[str, Any]]
    status: str
    """live, superseded, forgotten or erased."""
    superseded_by: str | None = None
    changed_at: float | None = None
    lines: list[dict[str, Any]] = field(default_factory=list)
    """The lines it was extracted from, verbatim, with their speakers and times (merges add theirs)."""
    model: str | None = None
    """The model that extracted it."""
    author: str = "run"
    """``run`` or ``operator`` (``loomrt memory add``, the MCP tool)."""

    def said(self) -> dict[str, Any] | None:
        """The shortest of its lines that supports it (:func:`~loomrt.harvest.evidence.said_of`)."""
        return said_of(self.statement, self.lines)

    def to_dict(self) -> dict[str, Any]:
        return {
            "fact_id": self.fact_id,
            "scope": self.scope,
            "class": self.cls,
            "subject": self.subject,
            "statement": self.statement,
            "observed_at": self.observed_at,
            "created_at": self.created_at,
            "status": self.status,
            "superseded_by": self.superseded_by,
            "changed_at": self.changed_at,
            "author": self.author,
            "model": self.model,
            "sources": self.sources,
            "lines": self.lines,
        }


_COLUMNS = (
    "fact_id, scope, class, subject, statement, observed_at, created_at, sources, status, superseded_by, changed_at, "
    "lines, model, author"
)


def _fact(row: tuple[Any, ...]) -> Fact:
    return Fact(
        fact_id=row[0],
        scope=row[1],
        cls=row[2],
        subject=row[3],
        statement=row[4],
        observed_at=row[5],
        created_at=row[6],
        sources=json.loads(row[7]),
        status=row[8],
        superseded_by=row[9],
        changed_at=row[10],
        lines=json.loads(row[11] or "[]"),
        model=row[12],
        author=row[13] or "run",
    )


def hit_of(fact: Fact, score: float, *, cosine: float | None = None, bm25: float | None = None) -> MemoryHit:
    """A fact as a memory hit: its statement, with the shortest source line that supports it
    (``provenance.said``), who wrote it and where it came from; its time is when that line was
    said (else when the fact was stored), as recall injection dates it."""
    provenance: dict[str, Any] = {"class": fact.cls, "observed_at": fact.observed_at, "author": fact.author}
    said = fact.said()
    line = best_line(fact.statement, fact.lines)
    ts = line.get("ts") if line is not None else None
    if said is not None:
        provenance["said"] = said
    if fact.model:
        provenance["model"] = fact.model
    provenance["sources"] = fact.sources
    return MemoryHit(
        text=fact.statement,
        score=score,
        ts=ts if isinstance(ts, int | float) else fact.created_at,
        scope=fact.scope,
        id=fact.fact_id,
        provenance=provenance,
        cosine=cosine,
        bm25=bm25,
    )
