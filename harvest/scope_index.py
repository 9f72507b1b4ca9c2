"""Durable memory's search index of one scope, in the process (SQLite searches it; on
PostgreSQL it holds the facts alone, for placement).

Facts and passages are kept apart, each scored its own way (:data:`FACT_FUSION`,
:data:`~loomrt.harvest.passages.PASSAGE_FUSION`), the cosine scaled over rows of its own kind
and BM25 on one scale for both (:func:`~loomrt.recall.index.search_together`). A passage is
matched with the words of the live passage said before it (its ``before`` reference): an
erased or forgotten one bumps the revision, and the index is built again without it.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import numpy as np

from loomrt.harvest.passages import PASSAGE, PASSAGE_FUSION
from loomrt.recall.embedders import Embedder
from loomrt.recall.index import Entry, Fusion, RecallIndex

__all__ = ["ScopeIndex", "FACT_FUSION"]

FACT_FUSION = Fusion(dense=0.5, lexical=0.5, lexical_window=0.0, lexical_context=0.0)
"""Facts stand alone: no window, no neighbourhood."""


class ScopeIndex:
    """The live facts and passages of one scope, searchable; kept in step by rowid and revision."""

    def __init__(self, embedder: Embedder | None):
        # one vector a row, as stored (a fact is one statement: no chunks)
        self.embedder = embedder
        self.index = RecallIndex(embedder, max_entries=10_000_000, fusion=FACT_FUSION, passages=False)
        self.passages = RecallIndex(embedder, max_entries=10_000_000, fusion=PASSAGE_FUSION, passages=False)
        self.said: dict[str, str] = {}
        """Each indexed passage's words by its id (a later passage's line before it)."""
        self.ids: dict[int, str] = {}
        """Each fact entry's fact id (placement's nearest facts)."""
        self.rowid = 0
        self.rev = -1

    def add_rows(self, rows: Sequence[tuple[Any, ...]]) -> None:
        """Index new live rows, oldest first: ``(row key, fact id, statement, vector, class,
        subject, lines)``, with their stored vectors where they fit the embedder."""
        if not rows:
            return
        facts, passages = [], []
        for _, fid, text, vector, cls, subject, lines in rows:
            if cls != PASSAGE:
                facts.append((Entry(id=-1, run_id=fid, seq=None, distillation_seq=0, role=cls, text=text), vector))
                continue
            first = (json.loads(lines or "[]") or [{}])[0]
            before = self.said.get(first.get("before") or "", "")  # live passages only
            passages.append((Entry(-1, fid, None, 0, cls, text, speaker=subject or None, before=before), vector))
            self.said[fid] = text
        for index, added in ((self.index, facts), (self.passages, passages)):
            if not added:
                continue
            drafts = [e for e, _ in added]
            vectors = None
            if index.dense and self.embedder is not None:
                dim = self.embedder.dim
                if all(b is not None and len(b) == dim * 4 for _, b in added):
                    vectors = np.stack([np.frombuffer(b, dtype=np.float32) for _, b in added])
                else:
                    vectors = index.embed(drafts)
            for e in index.add(drafts, vectors=vectors):
                if index is self.index:
                    self.ids[e.id] = e.run_id
        self.rowid = rows[-1][0]
