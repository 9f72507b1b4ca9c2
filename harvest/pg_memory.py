"""Durable memory on PostgreSQL: facts searched in the database, for any number of workers.

Writing, placement, history and forgetting are :class:`~loomrt.harvest.memory.MemoryStore`'s
(the same SQL on both backends). Search is the database's, over the columns
``harvest_0003_memory_search`` adds:

- **Lexical**: the statement's recall tokens (:func:`loomrt.recall.index.tokenize`: stems,
  compounds kept whole) stored as a ``tsvector`` with their positions and matched through
  its GIN index; scored with BM25 in SQL (k1 1.5, b 0.75, as :mod:`loomrt.recall.bm25`),
  since ``ts_rank`` has no inverse document frequency.
- **Dense**: cosine through pgvector's HNSW index (iterative scans, so a scope filter still
  yields ``k`` rows) where the server has pgvector and the embedder's dimension is indexed;
  else exactly, over the stored ``bytea`` vectors.
- **Fusion** as recall's (:class:`~loomrt.recall.index.Fusion`): BM25 scaled by its best,
  cosine by ``(cos - mean) / (best - mean)`` with the scope's mean vector, weighted 0.5/0.5.

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

from loomrt.harvest.memory import MemoryStore
from loomrt.harvest.pg import HNSW_DIMS, PgHarvestDB
from loomrt.recall.index import tokenize
from loomrt.recall.memory import MemoryHit

__all__ = ["PgMemoryStore", "lexemes"]

_log = logging.getLogger("loomrt.harvest")
_K1, _B = 1.5, 0.75
_POOL = 64
"""Candidates each signal contributes before fusion (at least ``4 * top_k``)."""
_noticed: set[str] = set()
_noticed_lock = threading.Lock()


def _quote(term: str) -> str:
    return "'" + term.replace("\\", "\\\\").replace("'", "''") + "'"


def lexemes(text: str) -> tuple[str, int]:
    """``text``'s recall tokens as a ``tsvector`` literal (each with its positions), and how many."""
    positions: dict[str, list[int]] = {}
    tokens = tokenize(text)
    for i, t in enumerate(tokens[:16383], start=1):
        positions.setdefault(t, []).append(i)
    return " ".join(f"{_quote(t)}:{','.join(map(str, p[:256]))}" for t, p in positions.items()), len(tokens)


def _vector(vec: np.ndarray) -> str:
    return "[" + ",".join(f"{float(x):.7g}" for x in vec) + "]"


class PgMemoryStore(MemoryStore):
    """Durable memory in a PostgreSQL database (a :class:`~loomrt.harvest.pg.PgHarvestDB`)."""

    db: PgHarvestDB

    def __init__(self, db: PgHarvestDB, *, embedder: Any = None):
        super().__init__(db, embedder=embedder)
        self.pgvector = "vector" in db.extensions
        if self.embedder is not None and not self.pgvector:
            self._notice(f"pgvector is not installed in {db.path}: durable-memory vectors are searched exactly "
                         "(fine to ~100,000 facts; install pgvector and run `loomrt db migrate` for an HNSW index)")

    @staticmethod
    def _notice(message: str) -> None:
        with _noticed_lock:
            if message in _noticed:
                return
            _noticed.add(message)
        _log.warning(message)

    # the columns search reads, kept with each row MemoryStore writes

    def _stored(self, conn: Any, fact_id: str, statement: str, vec: np.ndarray | None) -> None:
        text, n = lexemes(statement)
        if vec is not None and self.pgvector:
            conn.execute("UPDATE memory_facts SET lexemes = ?::tsvector, n_tokens = ?, embedding = ?::vector "
                         "WHERE fact_id = ?", (text, n, _vector(vec), fact_id))
        else:
            conn.execute("UPDATE memory_facts SET lexemes = ?::tsvector, n_tokens = ? WHERE fact_id = ?",
                         (text, n, fact_id))

    def _erased(self, conn: Any, fact_id: str) -> None:
        conn.execute("UPDATE memory_facts SET lexemes = NULL" + (", embedding = NULL" if self.pgvector else "")
                     + " WHERE fact_id = ?", (fact_id,))

    # search

    def search(self, query: str, top_k: int, scopes: Sequence[str]) -> list[MemoryHit]:
        """The best ``top_k`` live facts of ``scopes`` for ``query``, best first."""
        if not scopes or top_k <= 0:
            return []
        pool = max(_POOL, 4 * top_k)
        q = self._embed([query])
        with self.db.scoped(scopes), self.db.write() as conn:  # one snapshot; RLS sees only ``scopes``
            lexical = self._bm25(conn, Counter(tokenize(query)), scopes, pool)
            dense, mean = self._dense(conn, q[0], scopes, pool) if q is not None else ({}, 0.0)
            score: dict[str, float] = {}
            weight = 0.0
            if lexical:
                best = max(lexical.values())
                for fid, s in lexical.items():
                    score[fid] = 0.5 * s / best
                weight += 0.5
            if q is not None:
                missing = [fid for fid in score if fid not in dense]
                dense.update(self._cosines(conn, q[0], missing))
                best = max(dense.values(), default=0.0)
                for fid, cos in dense.items():
                    scaled = (cos - mean) / (best - mean) if best > mean else 0.0
                    score[fid] = score.get(fid, 0.0) + 0.5 * scaled
                weight += 0.5
            ranked = sorted(score.items(), key=lambda kv: (-kv[1], kv[0]))[:top_k]
            facts = self._by_id([fid for fid, _ in ranked])
        return [MemoryHit(text=facts[fid].statement, score=round(float(np.clip(s / weight, 0.0, 1.0)), 6),
                          ts=facts[fid].created_at, scope=facts[fid].scope, id=fid,
                          provenance={"class": facts[fid].cls, "observed_at": facts[fid].observed_at,
                                      "sources": facts[fid].sources})
                for fid, s in ranked if fid in facts]

    def _bm25(self, conn: Any, terms: Counter[str], scopes: Sequence[str], pool: int) -> dict[str, float]:
        """BM25 of the facts that match any of ``terms`` (the best ``pool``), in the database."""
        if not terms:
            return {}
        words = list(terms)
        stats = conn.execute(
            "SELECT count(*), coalesce(avg(n_tokens), 1), "
            + ", ".join("count(*) FILTER (WHERE lexemes @@ ?::tsquery)" for _ in words)
            + " FROM memory_facts WHERE scope = ANY(?) AND status = 'live'",
            [*(_quote(w) for w in words), list(scopes)]).fetchone()
        n, avgdl, dfs = int(stats[0]), float(stats[1]) or 1.0, stats[2:]
        idf = [float(np.log(1 + (n - df + 0.5) / (df + 0.5))) * terms[w] for w, df in zip(words, dfs, strict=True)]
        rows = conn.execute(
            "WITH q AS (SELECT * FROM unnest(?::text[], ?::float8[]) AS q(term, idf)), "
            "c AS (SELECT fact_id, lexemes, n_tokens FROM memory_facts WHERE scope = ANY(?) AND status = 'live' "
            "AND lexemes @@ ?::tsquery) "
            "SELECT c.fact_id, sum(q.idf * array_length(u.positions, 1) / (array_length(u.positions, 1) "
            "+ ? * (1 - ? + ? * c.n_tokens / ?))) AS s "
            "FROM c, unnest(c.lexemes) AS u JOIN q ON q.term = u.lexeme GROUP BY c.fact_id ORDER BY s DESC LIMIT ?",
            [words, idf, list(scopes), " | ".join(_quote(w) for w in words), _K1, _B, _B, avgdl, pool]).fetchall()
        return {fid: float(s) for fid, s in rows if s and s > 0}

    def _dense(self, conn: Any, q: np.ndarray, scopes: Sequence[str], pool: int) -> tuple[dict[str, float], float]:
        """The ``pool`` facts nearest ``q`` by cosine, and the scopes' mean cosine with ``q``."""
        d = len(q)
        if self.pgvector:
            cast = f"embedding::vector({d})"
            if d in HNSW_DIMS:  # the index filters by scope as it goes, rather than after its first ef rows
                conn.execute("SET LOCAL hnsw.iterative_scan = relaxed_order")
                conn.execute(f"SET LOCAL hnsw.ef_search = {max(40, pool)}")
            where = f"scope = ANY(?) AND status = 'live' AND vector_dims(embedding) = {d}"
            rows = conn.execute(
                f"SELECT fact_id, 1 - ({cast} <=> ?::vector({d})) FROM memory_facts WHERE {where} "
                f"ORDER BY {cast} <=> ?::vector({d}) LIMIT ?", [_vector(q), list(scopes), _vector(q), pool]).fetchall()
            (centroid,) = conn.execute(f"SELECT avg({cast})::text FROM memory_facts WHERE {where}",
                                       [list(scopes)]).fetchone()
            mean = float(np.fromstring(centroid.strip("[]"), sep=",", dtype=np.float32) @ q) if centroid else 0.0
            return {fid: float(c) for fid, c in rows}, mean
        ids, vecs = self._vectors(conn, "scope = ANY(?) AND status = 'live'", [list(scopes)], d)
        if not ids:
            return {}, 0.0
        cos = vecs @ q
        top = np.argsort(-cos, kind="stable")[:pool]
        return {ids[i]: float(cos[i]) for i in top}, float(vecs.mean(axis=0) @ q)

    def _cosines(self, conn: Any, q: np.ndarray, fact_ids: list[str]) -> dict[str, float]:
        """The cosine of each of ``fact_ids`` with ``q`` (facts without a vector: 0)."""
        if not fact_ids:
            return {}
        ids, vecs = self._vectors(conn, "fact_id = ANY(?)", [fact_ids], len(q))
        found = dict(zip(ids, (vecs @ q).tolist(), strict=True)) if ids else {}
        return {fid: float(found.get(fid, 0.0)) for fid in fact_ids}

    @staticmethod
    def _vectors(conn: Any, where: str, args: list[Any], d: int) -> tuple[list[str], np.ndarray]:
        rows = [(fid, b) for fid, b in conn.execute(f"SELECT fact_id, vector FROM memory_facts WHERE {where}",
                                                    args).fetchall() if b is not None and len(b) == 4 * d]
        if not rows:
            return [], np.zeros((0, d), dtype=np.float32)
        return [fid for fid, _ in rows], np.stack([np.frombuffer(b, dtype=np.float32) for _, b in rows])
