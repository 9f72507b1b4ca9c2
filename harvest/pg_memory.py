"""Durable memory on PostgreSQL: facts searched in the database, for any number of workers.

Writing, placement, history and forgetting are :class:`~loomrt.harvest.memory.MemoryStore`'s
(the same SQL on both backends). Search is the database's, over the columns
``harvest_0003_memory_search`` adds:

- **Lexical**: BM25 in SQL (k1 1.5, b 0.75, as :mod:`loomrt.recall.bm25`) over
  ``memory_terms``, each live fact's recall tokens (:func:`loomrt.recall.index.tokenize`:
  stems, compounds whole and in parts) with their frequencies; a fact's postings are written
  with it and deleted when it is superseded, forgotten or erased. A passage's hold the words
  of the passage said before it too, marked ``via`` that row, and are written again without
  them when it leaves search.
- **Dense**: cosine through pgvector's HNSW index (iterative scans, so a scope filter still
  yields ``k`` rows) where the server has pgvector and the embedder's dimension is indexed;
  else exactly, over the stored ``bytea`` vectors.
- **Fusion** as recall's (:class:`~loomrt.recall.index.Fusion`): BM25 (its term statistics
  over both kinds) scaled by the best of every row found, cosine by ``(cos - mean) / (best -
  mean)`` with the kind's mean vector over its own kind, weighted as the SQLite store weighs
  them (facts 0.5/0.5; a passage's postings are its window's, the words said before it then its
  own, weighted 1.0 to the cosine's 0.5: :data:`~loomrt.harvest.passages.PASSAGE_FUSION`).

Every search runs with ``loomrt.scopes`` set to the scopes asked for, so row-level
security keeps a run's reads inside its grant in the database as well.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from collections.abc import Sequence
from typing import Any

import numpy as np

from loomrt.harvest.memory import MemoryStore, hit_of
from loomrt.harvest.passages import (
    PASSAGE,
    PASSAGE_FUSION,
    TIERS,
    classes_of,
    distinct_hits,
    is_passage_id,
    passage_label,
)
from loomrt.harvest.pg import HNSW_DIMS, PgHarvestDB, write_terms
from loomrt.harvest.pg import vector_text as _vector
from loomrt.harvest.scope_index import FACT_FUSION
from loomrt.recall.embedders import EmbedderChoice
from loomrt.recall.index import tokenize
from loomrt.recall.memory import MemoryHit

__all__ = ["PgMemoryStore"]

_log = logging.getLogger("loomrt.harvest")
_K1, _B = 1.5, 0.75
_POOL = 64
"""Candidates each signal contributes before fusion (at least ``4 * top_k``)."""
_ANALYZE_AFTER = 500
"""An import this large refreshes the tables' statistics (autovacuum would, a minute later)."""
_noticed: set[str] = set()
_noticed_lock = threading.Lock()


def _bm25_scale(every: dict[str, float], kind: dict[str, float]) -> float:
    """What the BM25 of the rows of one kind (``kind``) is scaled by: the best of every row
    searched (``every``), of either kind, so the two kinds rank on one scale."""
    return max(every.values(), default=0.0)


def _fused(
    lexical: dict[str, float], dense: dict[str, float], means: dict[bool, float], *, dense_on: bool
) -> dict[str, float]:
    """Each row's score in [0, 1], as the SQLite store's two indexes fuse them: facts by
    :data:`~loomrt.harvest.scope_index.FACT_FUSION`, passages by :data:`PASSAGE_FUSION` (their postings are their windows'),
    BM25 scaled by the best of all rows (:func:`~loomrt.recall.index.search_together`), the
    cosine by its best among the rows of the same kind (from that kind's mean vector,
    ``means``), over the weights of the signals in use (BM25, and the cosine when
    ``dense_on``), whether or not a row of the kind matched them."""
    out: dict[str, float] = {}
    for passages, fusion in ((False, FACT_FUSION), (True, PASSAGE_FUSION)):
        lex = {f: s for f, s in lexical.items() if is_passage_id(f) == passages}
        cos = {f: c for f, c in dense.items() if is_passage_id(f) == passages}
        mean = means.get(passages, 0.0)
        signals = [(fusion.lexical_window if passages else fusion.lexical, lex, 0.0), (fusion.dense, cos, mean)]
        weight = signals[0][0] + (fusion.dense if dense_on else 0.0)
        for w, got, floor in signals:
            best = _bm25_scale(lexical, lex) if got is lex else max(got.values(), default=0.0)
            for fid, v in got.items():
                scaled = (v - floor) / (best - floor) if best > floor else 0.0
                out[fid] = out.get(fid, 0.0) + w * scaled / weight
    return {fid: float(np.clip(v, 0.0, 1.0)) for fid, v in out.items()}


class PgMemoryStore(MemoryStore):
    """Durable memory in a PostgreSQL database (a :class:`~loomrt.harvest.pg.PgHarvestDB`)."""

    db: PgHarvestDB
    shared = True
    """A read waits on the server: async callers make it off their event loop (:class:`ScopedMemory`)."""
    searches_here = False

    def __init__(self, db: PgHarvestDB, *, embedder: EmbedderChoice = None):
        super().__init__(db, embedder=embedder)
        self.pgvector = "vector" in db.extensions
        self._cache: dict[
            tuple[tuple[str, ...], int], tuple[tuple[Any, Any], tuple[int, float, dict[bool, np.ndarray]]]
        ] = {}
        if self.embedder is not None and not self.pgvector:
            self._notice(
                f"pgvector is not installed in {db.path}: durable-memory vectors are searched exactly "
                "(fine to ~100,000 facts; install pgvector and run `loomrt db migrate` for an HNSW index)"
            )

    @staticmethod
    def _notice(message: str) -> None:
        with _noticed_lock:
            if message in _noticed:
                return
            _noticed.add(message)
        _log.warning(message)

    # the columns search reads, kept with each row MemoryStore writes

    def _search_columns(self, statement: str, vec: np.ndarray | None) -> dict[str, tuple[str, Any]]:
        out: dict[str, tuple[str, Any]] = {"n_tokens": ("?", len(tokenize(statement)))}
        if vec is not None and self.pgvector:
            out["embedding"] = ("?::vector", _vector(vec))
        return out

    def _indexed(self, conn: Any, fact_id: str, scope: str, label: str, *, before: str | None = None) -> None:
        said = None
        if before is not None:  # a passage's window: the words of the live passage said before it
            row = conn.execute(  # (locked: it is not erased before this write commits its postings)
                "SELECT statement FROM memory_facts WHERE fact_id = ? AND scope = ? AND status = 'live' FOR SHARE",
                (before, scope),
            ).fetchone()
            said = row[0] if row else None
        write_terms(conn, fact_id, scope, label, said, before)

    def _hidden(self, conn: Any, fact_id: str, *, erased: bool) -> None:
        conn.execute("DELETE FROM memory_terms WHERE fact_id = ?", (fact_id,))
        after = conn.execute(  # passages said after it: their windows held its words
            "SELECT fact_id, scope, subject, statement FROM memory_facts WHERE fact_id IN "
            "(SELECT DISTINCT fact_id FROM memory_terms WHERE via = ?)",
            (fact_id,),
        ).fetchall()
        for fid, scope, subject, statement in after:
            write_terms(conn, fid, scope, passage_label(subject, statement))
        if erased and self.pgvector:
            conn.execute("UPDATE memory_facts SET embedding = NULL WHERE fact_id = ?", (fact_id,))

    def import_facts(self, items: Sequence[tuple[str, str]], *, cls: str = "fact") -> list[str]:
        ids = super().import_facts(items, cls=cls)
        if len(items) >= _ANALYZE_AFTER:  # the planner picks the HNSW and postings indexes from fresh statistics
            with self.db.write() as conn:
                conn.execute("ANALYZE memory_facts")
                conn.execute("ANALYZE memory_terms")
        return ids

    # search

    def search(self, query: str, top_k: int, scopes: Sequence[str], tiers: Sequence[str] = TIERS) -> list[MemoryHit]:
        """The best ``top_k`` live facts and passages (``tiers``) of ``scopes`` for ``query``,
        fused (:func:`_fused`: BM25 on one scale for both kinds), best first (a passage a
        better hit states already left out)."""
        only = classes_of(tiers)
        if not scopes or top_k <= 0:
            return []
        where = "" if only is None else f" AND class {'=' if only == PASSAGE else '<>'} '{PASSAGE}'"
        pool = max(_POOL, 4 * top_k)
        q = self._embed([query])
        with self.db.scoped(scopes), self.db.write() as conn:  # one snapshot; RLS sees only ``scopes``
            n, avgdl, centroids = self._stats(conn, scopes, q.shape[1] if q is not None else 0)
            lexical = self._bm25(conn, Counter(tokenize(query)), scopes, pool, n, avgdl, where)
            dense: dict[str, float] = {}
            if q is not None:
                dense = self._dense(conn, q[0], scopes, pool, where)
                dense.update(self._cosines(conn, q[0], [fid for fid in lexical if fid not in dense]))
            means = {kind: float(c @ q[0]) for kind, c in centroids.items()} if q is not None else {}
            score = _fused(lexical, dense, means, dense_on=q is not None)
            ranked = sorted(score.items(), key=lambda kv: (-kv[1], kv[0]))[: 2 * top_k]
            facts = self._by_id([fid for fid, _ in ranked])
        hits = [
            hit_of(facts[fid], round(s, 6), cosine=dense.get(fid), bm25=lexical.get(fid, 0.0))
            for fid, s in ranked
            if fid in facts
        ]
        return distinct_hits(hits, top_k)

    def _stats(self, conn: Any, scopes: Sequence[str], d: int) -> tuple[int, float, dict[bool, np.ndarray]]:
        """The live rows of ``scopes``: how many, their mean length in tokens, the mean vector
        of the facts (``False``) and of the passages (``True``); computed again only when rows
        were added or hidden since (one cheap query)."""
        ((rev, top),) = conn.execute(
            "SELECT (SELECT rev FROM memory_revision), (SELECT max(row_no) FROM memory_facts)"
        ).fetchall()
        key = (tuple(sorted(scopes)), d)
        cached = self._cache.get(key)
        if cached is not None and cached[0] == (rev, top):
            return cached[1]
        n, avgdl = conn.execute(
            "SELECT count(*), coalesce(avg(n_tokens), 1) FROM memory_facts WHERE scope = ANY(?) AND status = 'live'",
            [list(scopes)],
        ).fetchone()
        centroids: dict[bool, np.ndarray] = {}
        if d and self.pgvector:
            for passages, text in conn.execute(
                f"SELECT class = '{PASSAGE}', avg(embedding::vector({d}))::text FROM memory_facts WHERE scope = ANY(?) "
                f"AND status = 'live' AND vector_dims(embedding) = {d} GROUP BY 1",
                [list(scopes)],
            ).fetchall():
                if text:
                    centroids[bool(passages)] = np.array(text.strip("[]").split(","), dtype=np.float32)
        elif d:
            ids, vecs = self._vectors(conn, "scope = ANY(?) AND status = 'live'", [list(scopes)], d)
            kinds = np.array([is_passage_id(i) for i in ids], dtype=bool)
            for passages in (False, True):
                if (kinds == passages).any():
                    centroids[passages] = vecs[kinds == passages].mean(axis=0)
        value = (int(n), float(avgdl) or 1.0, centroids)
        self._cache[key] = ((rev, top), value)
        return value

    def _bm25(
        self, conn: Any, terms: Counter[str], scopes: Sequence[str], pool: int, n: int, avgdl: float, where: str = ""
    ) -> dict[str, float]:
        """BM25 of the facts holding any of ``terms`` (the best ``pool``), in the database, from
        the postings: each term's document frequency first (an index-only count), then each
        fact's sum over its terms."""
        if not terms or not n:
            return {}
        words = list(terms)
        dfs = dict(
            conn.execute(
                "SELECT term, count(*) FROM memory_terms WHERE scope = ANY(?) AND term = ANY(?) GROUP BY term",
                [list(scopes), words],
            ).fetchall()
        )
        found = [w for w in words if dfs.get(w)]
        if not found:
            return {}
        idf = [terms[w] * float(np.log(1 + (n - dfs[w] + 0.5) / (dfs[w] + 0.5))) for w in found]
        rows = conn.execute(
            "SELECT m.fact_id, sum(w.idf * m.tf / (m.tf + ?::float8 * (1 - ?::float8 + ?::float8 * m.n_tokens / "
            "?::float8))) AS s FROM memory_terms m JOIN unnest(?::text[], ?::float8[]) AS w(term, idf) USING (term) "
            "WHERE m.scope = ANY(?)"
            + (f" AND EXISTS (SELECT 1 FROM memory_facts WHERE fact_id = m.fact_id{where})" if where else "")
            + " GROUP BY m.fact_id ORDER BY s DESC LIMIT ?",
            [_K1, _B, _B, avgdl, found, idf, list(scopes), pool],
        ).fetchall()
        return {fid: float(s) for fid, s in rows if s and s > 0}

    def _dense(self, conn: Any, q: np.ndarray, scopes: Sequence[str], pool: int, where: str = "") -> dict[str, float]:
        """The ``pool`` facts nearest ``q`` by cosine."""
        d = len(q)
        if self.pgvector:
            cast = f"embedding::vector({d})"
            if d in HNSW_DIMS:  # the index filters by scope as it goes, rather than after its first ef rows
                conn.execute("SET LOCAL hnsw.iterative_scan = relaxed_order")
                conn.execute(f"SET LOCAL hnsw.ef_search = {max(40, pool)}")
            rows = conn.execute(
                f"SELECT fact_id, 1 - ({cast} <=> ?::vector({d})) FROM memory_facts WHERE scope = ANY(?) AND "
                f"status = 'live' AND vector_dims(embedding) = {d}{where} ORDER BY {cast} <=> ?::vector({d}) LIMIT ?",
                [_vector(q), list(scopes), _vector(q), pool],
            ).fetchall()
            return {fid: float(c) for fid, c in rows}
        ids, vecs = self._vectors(conn, f"scope = ANY(?) AND status = 'live'{where}", [list(scopes)], d)
        if not ids:
            return {}
        cos = vecs @ q
        return {ids[i]: float(cos[i]) for i in np.argsort(-cos, kind="stable")[:pool]}

    def _cosines(self, conn: Any, q: np.ndarray, fact_ids: list[str]) -> dict[str, float]:
        """The cosine of each of ``fact_ids`` with ``q`` (facts without a vector: 0)."""
        if not fact_ids:
            return {}
        ids, vecs = self._vectors(conn, "fact_id = ANY(?)", [fact_ids], len(q))
        found = dict(zip(ids, (vecs @ q).tolist(), strict=True)) if ids else {}
        return {fid: float(found.get(fid, 0.0)) for fid in fact_ids}

    @staticmethod
    def _vectors(conn: Any, where: str, args: list[Any], d: int) -> tuple[list[str], np.ndarray]:
        rows = [
            (fid, b)
            for fid, b in conn.execute(f"SELECT fact_id, vector FROM memory_facts WHERE {where}", args).fetchall()
            if b is not None and len(b) == 4 * d
        ]
        if not rows:
            return [], np.zeros((0, d), dtype=np.float32)
        return [fid for fid, _ in rows], np.stack([np.frombuffer(b, dtype=np.float32) for _, b in rows])
