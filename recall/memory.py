"""The interface a durable-memory source meets, so that Recall can fall back to it.

Durable memory lives in ``loomrt.harvest``, one floor up; recall declares only this small
protocol, and the place where a run's toolset is resolved wires a concrete source in
(``Runtime(memory=...)``). Recall merges memory hits with the run's own hits by score.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

__all__ = ["MemoryHit", "MemorySource"]


@dataclass(frozen=True)
class MemoryHit:
    """One durable-memory item that matched a query."""

    text: str
    """The fact, verbatim as stored."""
    score: float
    """Relevance in [0, 1] (1 is best), comparable with a run hit's score."""
    ts: float | None = None
    """Unix time the words it came from were said (else when the fact was stored)."""
    source: str = "memory"
    """Always ``"memory"``."""
    scope: str | None = None
    """Whose memory it is: ``user``, ``agent`` or ``project``."""
    id: str | None = None
    """The fact's id in its store."""
    provenance: dict[str, Any] = field(default_factory=dict)
    """Where the fact came from (e.g. run id and record seqs); ``author``: ``operator`` for
    what an operator wrote by hand, else ``run`` (Recall's ``source: "operator"`` reads it)."""
    cosine: float | None = None
    """The raw cosine of the query with the item, where the source knows it (``score`` is
    scaled per query, so the best is always near 1; recall injection judges relevance on this)."""
    bm25: float | None = None
    """The raw BM25 score of the item for the query, where the source knows it."""


@runtime_checkable
class MemorySource(Protocol):
    """Anything that can search durable memory.

    ``scopes`` are the scopes the agent may read (``None``: the source's own default for
    the agent); a source must never return items of other scopes. A hit may be a
    :class:`MemoryHit` or a mapping with the same keys (at least ``text`` and ``score``).
    """

    def search(
        self, query: str, top_k: int, scopes: Sequence[str] | None = None
    ) -> Sequence[MemoryHit | dict[str, Any]]:
        """The best ``top_k`` items for ``query``, best first."""
        ...
