"""Durable memory: facts, their vectors and history, scoped search.

A fact is a row of ``memory_facts`` (statement, class, subject, scope, sources back to the
record) and the vector of its statement (the stored text is the embedded text). Search
fuses dense and lexical matching the way recall does (a
:class:`~loomrt.recall.index.RecallIndex` per scope, kept in step with the table), over
live facts only. :class:`ScopedMemory` is what a run reads through: the
:class:`~loomrt.recall.memory.MemorySource` Recall falls back to, checked against the
run's granted scopes on every call.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Protocol

import numpy as np

from loomrt.errors import NotFoundError
from loomrt.harvest.db import Tables, row_lock
from loomrt.harvest.facts import _COLUMNS, Fact, NewFact, _fact, fact_key, hit_of
from loomrt.harvest.passages import (
    FACT_TIERS,
    PASSAGE,
    TIERS,
    classes_of,
    distinct_hits,
    new_lines,
    passage_label,
    said_words,
    store_passages,
)
from loomrt.harvest.placement import MERGE_COSINE, SUPERSEDE_COSINE, Candidate, Placement, dice, place
from loomrt.harvest.scope_index import ScopeIndex
from loomrt.harvest.scopes import check
from loomrt.recall.embedders import EmbedderChoice, resolve_embedder
from loomrt.recall.index import search_together
from loomrt.recall.memory import MemoryHit

__all__ = [
    "Fact",
    "NewFact",
    "DurableMemory",
    "MemoryStore",
    "ScopedMemory",
    "CLASSES",
    "fact_key",
    "hit_of",
]

CLASSES = ("preference", "fact", "decision", "identity", "constraint", "correction")


_NEAR = 8
"""How many of the nearest live facts (passages left out) placement weighs a new fact against."""


class DurableMemory(Protocol):
    """What a durable-memory store does (SQLite: :class:`MemoryStore`; PostgreSQL:
    :class:`~loomrt.harvest.pg_memory.PgMemoryStore`). Scope checks are the caller's
    (:class:`ScopedMemory`; on PostgreSQL row-level security checks them again)."""

    def write(
        self,
        facts: Sequence[NewFact],
        *,
        passages: Sequence[NewFact] = (),
        also: Callable[[Any], None] | None = None,
    ) -> dict[str, int]:
        """Store facts with placement, and passages once each, idempotently, in one
        transaction (``also`` joins it)."""
        ...

    def search(self, query: str, top_k: int, scopes: Sequence[str], tiers: Sequence[str] = TIERS) -> list[MemoryHit]:
        """The best live facts and passages (``tiers``) of ``scopes``, fused."""
        ...

    def facts(
        self,
        scopes: Sequence[str] | None = None,
        *,
        include_hidden: bool = False,
        limit: int = 1000,
        tiers: Sequence[str] = FACT_TIERS,
    ) -> list[Fact]:
        """Facts (and with ``tiers``, passages), oldest first."""
        ...

    def get(self, fact_id: str) -> Fact:
        """One fact, whatever its status."""
        ...

    def history(self, fact_id: str) -> list[dict[str, Any]]:
        """A fact's changes: created, merged, superseded, forgotten, erased."""
        ...

    def forget(self, fact_id: str, *, erase: bool = False, by: str = "operator") -> Fact:
        """Hide a fact (and with ``erase`` wipe its words), recorded."""
        ...


class MemoryStore:
    """Durable memory in ``db``: write (with placement), search, list, show, forget.

    ``embedder`` is as for recall (``None``: MiniLM, ``"hash"`` in tests, ``False``:
    lexical-only)."""

    searches_here = True
    """Whether search reads the in-process indexes (SQLite); where the database searches
    (PostgreSQL), they hold the facts alone, for placement."""

    def __init__(self, db: Tables, *, embedder: EmbedderChoice = None):
        self.db = db
        self.embedder = resolve_embedder(embedder)
        self._indexes: dict[str, ScopeIndex] = {}
        self._lock = threading.RLock()

    # ------------------------------------------------------------------ settings

    def bands(self) -> tuple[float, float]:
        """The merge and supersede cosine bands (calibrated, else the defaults)."""
        rows = dict(
            self.db.rows("SELECT key, value FROM memory_settings WHERE key IN ('merge_cosine', 'supersede_cosine')")
        )
        return float(rows.get("merge_cosine", MERGE_COSINE)), float(rows.get("supersede_cosine", SUPERSEDE_COSINE))

    def set_band(self, key: str, value: float) -> None:
        with self.db.write() as conn:
            conn.execute(
                "INSERT INTO memory_settings VALUES (?, ?) ON CONFLICT(key) DO UPDATE SET value = excluded.value",
                (key, str(value)),
            )

    # ------------------------------------------------------------------ writing

    def _embed(self, texts: list[str]) -> np.ndarray | None:
        if self.embedder is None or not texts:
            return None
        return np.asarray(self.embedder.embed(texts), dtype=np.float32)

    def write(
        self,
        facts: Sequence[NewFact],
        *,
        passages: Sequence[NewFact] = (),
        also: Callable[[Any], None] | None = None,
    ) -> dict[str, int]:
        """Store ``facts`` in one transaction: each is new, merged into a stored fact, or
        supersedes one (:func:`~loomrt.harvest.placement.place`); a key already written is
        skipped (a retried batch writes nothing new). ``passages`` are stored in the same
        transaction, once each (:func:`~loomrt.harvest.passages.store_passages`; counted as
        ``passages_new``, ``passages_kept_once``). ``also(conn)`` runs in it too (the
        consolidator marks its batch done there). Counts by outcome."""
        counts = {"new": 0, "merged": 0, "superseded": 0, "already": 0}
        vectors = self._embed([f.statement for f in facts])
        passage_vectors = self._embed([passage_label(p.subject, p.statement) for p in passages])
        merge_cos, supersede_cos = self.bands()
        now = time.time()
        written: list[tuple[NewFact, str, np.ndarray | None]] = []
        with self._lock, self._writing() as conn:
            for i, f in enumerate(facts):
                if conn.execute("SELECT 1 FROM memory_keys WHERE key = ?", (f.key,)).fetchone():
                    counts["already"] += 1
                    continue
                vec = vectors[i] if vectors is not None else None
                placed = place(
                    f.cls,
                    f.subject,
                    f.statement,
                    self._candidates(f, vec, written),
                    merge_cosine=merge_cos,
                    supersede_cosine=supersede_cos,
                )
                fact_id = self._apply(conn, f, vec, placed, now)
                if placed.action != "merge":
                    written.append((f, fact_id, vec))
                conn.execute("INSERT INTO memory_keys VALUES (?, ?, ?)", (f.key, fact_id, placed.action))
                counts[{"new": "new", "merge": "merged", "supersede": "superseded"}[placed.action]] += 1
            if passages:
                stored = store_passages(self, conn, passages, passage_vectors, now)
                counts.update({f"passages_{k}": stored[k] for k in ("new", "kept_once")})
            if also is not None:
                also(conn)
        return counts

    @contextlib.contextmanager
    def _writing(self) -> Iterator[Any]:
        """A write transaction; the search indexes are dropped if it rolls back (they may
        have read its uncommitted rows)."""
        try:
            with self.db.write() as conn:
                yield conn
        except BaseException:
            self._indexes.clear()
            raise

    def _candidates(
        self, f: NewFact, vec: np.ndarray | None, written: list[tuple[NewFact, str, np.ndarray | None]]
    ) -> list[Candidate]:
        """Live facts of ``f``'s scope near it (by cosine; by shared words without vectors),
        the facts this write stored before it included."""
        idx = self._index(f.scope)
        near: list[tuple[str, float]] = []
        k = _NEAR
        while True:  # the nearest facts (passages are in an index of their own)
            if vec is not None and idx.index.dense:
                found = idx.index.nearest(vec, k)
            else:
                found = [(h.entry, dice(h.entry.text, f.statement)) for h in idx.index.search(f.statement, k)]
            near = [(idx.ids[e.id], cos) for e, cos in found][:_NEAR]
            if len(near) >= _NEAR or len(found) < k:
                break
            k *= 4
        for other, fid, v in written:
            if other.scope == f.scope:
                near.append(
                    (
                        fid,
                        float(np.dot(v, vec))
                        if v is not None and vec is not None
                        else dice(other.statement, f.statement),
                    )
                )
        facts = self._by_id([fid for fid, _ in near])
        out = [
            Candidate(fid, facts[fid].cls, facts[fid].subject, facts[fid].statement, cos)
            for fid, cos in near
            if fid in facts and facts[fid].status == "live" and facts[fid].cls != PASSAGE
        ]
        return sorted(out, key=lambda c: -c.cosine)

    def _by_id(self, ids: Sequence[str]) -> dict[str, Fact]:
        """The facts of ``ids`` (those that exist), in one query."""
        wanted = list(dict.fromkeys(ids))
        if not wanted:
            return {}
        rows = self.db.rows(
            f"SELECT {_COLUMNS} FROM memory_facts WHERE fact_id IN ({','.join('?' * len(wanted))})", wanted
        )
        return {r[0]: _fact(r) for r in rows}

    def _apply(self, conn: Any, f: NewFact, vec: np.ndarray | None, placed: Placement, now: float) -> str:
        history = {
            "statement": f.statement,
            "class": f.cls,
            "key": f.key,
            "sources": f.sources,
            "cosine": placed.cosine,
            "why": placed.why,
        }
        if placed.action == "merge":
            assert placed.fact_id is not None
            sources, lines, status = conn.execute(
                f"SELECT sources, lines, status FROM memory_facts WHERE fact_id = ?{row_lock(self.db)}",
                (placed.fact_id,),
            ).fetchone()
            if status != "live":  # forgotten or erased since placement read it: the operator's decision stands
                return placed.fact_id
            conn.execute(
                "UPDATE memory_facts SET sources = ?, lines = ? WHERE fact_id = ? AND status = 'live'",
                (json.dumps([*json.loads(sources), *f.sources]), _joined(lines, f.lines), placed.fact_id),
            )
            conn.execute(
                "INSERT INTO memory_history (fact_id, at, action, data) VALUES (?, ?, 'merged', ?)",
                (placed.fact_id, now, json.dumps(history)),
            )
            return placed.fact_id
        fact_id = "m" + hashlib.sha256(f.key.encode()).hexdigest()[:11]
        self._insert(
            conn,
            (fact_id, f.scope, f.cls, f.subject, f.statement, f.observed_at, now, json.dumps(f.sources)),
            vec,
            lines=f.lines,
            model=f.model,
            author=f.author,
        )
        conn.execute(
            "INSERT INTO memory_history (fact_id, at, action, data) VALUES (?, ?, 'created', ?)",
            (fact_id, now, json.dumps(history)),
        )
        if placed.action == "supersede":
            assert placed.fact_id is not None
            conn.execute(
                "UPDATE memory_facts SET status = 'superseded', superseded_by = ?, changed_at = ? WHERE fact_id = ?",
                (fact_id, now, placed.fact_id),
            )
            self._hidden(conn, placed.fact_id, erased=False)
            conn.execute(
                "INSERT INTO memory_history (fact_id, at, action, data) VALUES (?, ?, 'superseded', ?)",
                (
                    placed.fact_id,
                    now,
                    json.dumps({"by": fact_id, "statement": f.statement, "cosine": placed.cosine, "why": placed.why}),
                ),
            )
            conn.execute("UPDATE memory_revision SET rev = rev + 1")
        return fact_id

    def import_facts(self, items: Sequence[tuple[str, str]], *, cls: str = "fact") -> list[str]:
        """Store ``(scope, statement)`` items as they are, in one transaction: no extraction,
        no placement (text known to stand alone, e.g. a corpus measured for search). A
        statement already imported to its scope is kept once. Their fact ids, in order."""
        vectors = self._embed([text for _, text in items])
        now = time.time()
        ids = []
        with self._lock, self._writing() as conn:
            for i, (scope, text) in enumerate(items):
                key = f"import:{scope}:{hashlib.sha256(text.encode()).hexdigest()[:16]}"
                fact_id = "m" + hashlib.sha256(key.encode()).hexdigest()[:11]
                ids.append(fact_id)
                if conn.execute("SELECT 1 FROM memory_keys WHERE key = ?", (key,)).fetchone():
                    continue
                vec = vectors[i] if vectors is not None else None
                self._insert(conn, (fact_id, scope, cls, "", text, None, now, "[]"), vec)
                conn.execute("INSERT INTO memory_keys VALUES (?, ?, 'import')", (key, fact_id))
                conn.execute(
                    "INSERT INTO memory_history (fact_id, at, action, data) VALUES (?, ?, 'created', ?)",
                    (fact_id, now, json.dumps({"statement": text, "key": key, "why": "imported"})),
                )
        return ids

    def _insert(
        self,
        conn: Any,
        row: tuple[Any, ...],
        vec: np.ndarray | None,
        *,
        lines: Sequence[dict[str, Any]] = (),
        model: str | None = None,
        author: str = "run",
        label: str | None = None,
        before: str | None = None,
    ) -> None:
        """Insert a live fact: ``row`` is fact id, scope, class, subject, statement, observed
        at, created at and sources (JSON); then its source lines, the model that extracted it
        and its author, its vector and what search keeps beside it: ``label`` is the text
        matched (default the statement), ``before`` the passage said before it (its words are
        matched with a passage's)."""
        extra = self._search_columns(label or row[4], vec)
        conn.execute(
            f"INSERT INTO memory_facts ({_COLUMNS}, vector, embedder{''.join(', ' + c for c in extra)}) VALUES "
            f"(?, ?, ?, ?, ?, ?, ?, ?, 'live', NULL, NULL, ?, ?, ?, ?, ?"
            f"{''.join(', ' + e for e, _ in extra.values())})",
            (
                *row,
                json.dumps(list(lines), ensure_ascii=False),
                model,
                author,
                vec.tobytes() if vec is not None else None,
                getattr(self.embedder, "name", None),
                *(v for _, v in extra.values()),
            ),
        )
        self._indexed(conn, row[0], row[1], label or row[4], before=before)

    def _search_columns(self, statement: str, vec: np.ndarray | None) -> dict[str, tuple[str, Any]]:
        """Columns a backend keeps beside a fact for searching it, as ``{column: (SQL
        placeholder, value)}`` (SQLite: none; its search indexes live in the process)."""
        return {}

    def _indexed(self, conn: Any, fact_id: str, scope: str, label: str, *, before: str | None = None) -> None:
        """Inside the write that inserted live fact ``fact_id``: what a backend indexes beside
        it, ``label`` and the words of passage ``before`` (SQLite: nothing; its index reads
        the rows)."""

    def _hidden(self, conn: Any, fact_id: str, *, erased: bool) -> None:
        """Inside the write that took fact ``fact_id`` out of search (superseded, forgotten or
        erased): drop what :meth:`_indexed` kept (and, ``erased``, what :meth:`_search_columns` did)."""

    def forget(self, fact_id: str, *, erase: bool = False, by: str = "operator") -> Fact:
        """Hide a fact from search (an operator's action, recorded in its history); with
        ``erase`` its statement, source lines and vector are wiped too (its history says so),
        and so is every passage of its scope that holds the same words: one whose lines cite a
        (run, seq) the fact's lines cite, or whose words are a cited line's."""
        fact = self.get(fact_id)
        now = time.time()
        with self._lock, self.db.write() as conn:
            if erase:
                cited = {(line.get("run_id"), line.get("seq")) for line in fact.lines}
                said = {said_words(str(line.get("text", ""))) for line in fact.lines} - {""}
                self._erase(conn, fact_id, fact.status, now, by)
                for pid, status in self._citing(conn, fact.scope, cited, said):
                    self._erase(conn, pid, status, now, by, because=fact_id)
            else:
                conn.execute(
                    "UPDATE memory_facts SET status = 'forgotten', changed_at = ? WHERE fact_id = ?", (now, fact_id)
                )
                self._forgotten(conn, fact_id, "forgotten", {"by": by, "was": fact.status}, now, erased=False)
            conn.execute("UPDATE memory_revision SET rev = rev + 1")
        return self.get(fact_id)

    def erase_said(self, run_id: str, seqs: Sequence[int], *, by: str = "operator") -> dict[str, int]:
        """Take the words of messages ``seqs`` of run ``run_id`` (marked private after they were
        banked) out of durable memory: every passage whose lines cite one is erased; a fact
        loses the lines that cite one, and is erased if none is left (its statement came from
        them alone). Counts ``passages`` and ``facts`` erased, and ``lines`` dropped from facts."""
        wanted = {(run_id, int(s)) for s in seqs}
        counts = {"passages": 0, "facts": 0, "lines": 0}
        if not wanted:
            return counts
        now = time.time()
        with self._lock, self.db.write() as conn:
            rows = conn.execute(
                "SELECT fact_id, status, class, lines FROM memory_facts WHERE status <> 'erased' AND lines LIKE ?",
                (f'%"{run_id}"%',),
            ).fetchall()
            for fid, status, cls, stored in rows:
                lines = json.loads(stored or "[]")
                kept = [ln for ln in lines if (ln.get("run_id"), ln.get("seq")) not in wanted]
                if len(kept) == len(lines):
                    continue
                if cls == PASSAGE or not kept:
                    self._erase(conn, fid, status, now, by, because=f"{run_id}: private")
                    counts["passages" if cls == PASSAGE else "facts"] += 1
                    continue
                conn.execute(
                    "UPDATE memory_facts SET lines = ?, changed_at = ? WHERE fact_id = ?",
                    (json.dumps(kept, ensure_ascii=False), now, fid),
                )
                data = {"by": by, "lines": len(lines) - len(kept), "with": f"{run_id}: private"}
                self._forgotten(conn, fid, "lines_erased", data, now, erased=None)
                counts["lines"] += len(lines) - len(kept)
            if any(counts.values()):
                conn.execute("UPDATE memory_revision SET rev = rev + 1")
        return counts

    @staticmethod
    def _citing(conn: Any, scope: str, cited: set[tuple[Any, Any]], said: set[str]) -> list[tuple[str, str]]:
        """Passages of ``scope`` not yet erased whose lines cite one of ``cited`` (run, seq), or
        whose words are one of ``said``: (fact id, status)."""
        rows = conn.execute(
            "SELECT fact_id, status, statement, lines FROM memory_facts WHERE scope = ? AND status <> 'erased' "
            f"AND class = '{PASSAGE}'",
            (scope,),
        ).fetchall()
        return [
            (fid, status)
            for fid, status, statement, stored in rows
            if said_words(statement) in said
            or any((ln.get("run_id"), ln.get("seq")) in cited for ln in json.loads(stored or "[]"))
        ]

    def _erase(self, conn: Any, fact_id: str, was: str, now: float, by: str, because: str | None = None) -> None:
        """Inside a write: wipe row ``fact_id``'s words, lines and vector; its history says who
        erased it (and, ``because``, with which fact or private mark)."""
        conn.execute(
            "UPDATE memory_facts SET status = 'erased', statement = '', subject = '', lines = '[]', vector = NULL, "
            "changed_at = ? WHERE fact_id = ?",
            (now, fact_id),
        )
        conn.execute("UPDATE memory_history SET data = '{}' WHERE fact_id = ?", (fact_id,))
        data = {"by": by, "was": was, **({"with": because} if because else {})}
        self._forgotten(conn, fact_id, "erased", data, now, erased=True)

    def _forgotten(
        self, conn: Any, fact_id: str, action: str, data: dict[str, Any], now: float, *, erased: bool | None
    ) -> None:
        """Inside a write: record ``action`` in ``fact_id``'s history; ``erased`` not None: the
        row left search (``erased``: its words with it)."""
        conn.execute(
            "INSERT INTO memory_history (fact_id, at, action, data) VALUES (?, ?, ?, ?)",
            (fact_id, now, action, json.dumps(data)),
        )
        if erased is not None:
            self._hidden(conn, fact_id, erased=erased)

    # ------------------------------------------------------------------ reading

    def get(self, fact_id: str) -> Fact:
        rows = self.db.rows(f"SELECT {_COLUMNS} FROM memory_facts WHERE fact_id = ?", (fact_id,))
        if not rows:
            raise NotFoundError(f"no fact {fact_id!r} in {self.db.path}. `loomrt memory list` shows the facts.")
        return _fact(rows[0])

    def history(self, fact_id: str) -> list[dict[str, Any]]:
        return [
            {"at": at, "action": action, **json.loads(data)}
            for at, action, data in self.db.rows(
                "SELECT at, action, data FROM memory_history WHERE fact_id = ? ORDER BY id", (fact_id,)
            )
        ]

    def facts(
        self,
        scopes: Sequence[str] | None = None,
        *,
        include_hidden: bool = False,
        limit: int = 1000,
        tiers: Sequence[str] = FACT_TIERS,
    ) -> list[Fact]:
        sql, args = f"SELECT {_COLUMNS} FROM memory_facts WHERE 1=1", []
        if "passages" not in tiers or "facts" not in tiers:
            sql += f" AND class {'=' if 'facts' not in tiers else '<>'} '{PASSAGE}'"
        if scopes is not None:
            sql += f" AND scope IN ({','.join('?' * len(scopes))})"
            args += list(scopes)
        if not include_hidden:
            sql += " AND status = 'live'"
        return [_fact(r) for r in self.db.rows(sql + " ORDER BY created_at, fact_id LIMIT ?", [*args, limit])]

    def scopes(self) -> list[str]:
        return [r[0] for r in self.db.rows("SELECT DISTINCT scope FROM memory_facts ORDER BY scope")]

    def _index(self, scope: str) -> ScopeIndex:
        """The search index of ``scope``, brought up to date (new facts added; rebuilt when a
        fact was superseded or forgotten)."""
        (rev,) = self.db.rows("SELECT rev FROM memory_revision")[0]
        idx = self._indexes.get(scope)
        if idx is None or idx.rev != rev:
            idx = self._indexes[scope] = ScopeIndex(self.embedder)
            idx.rev = rev
        n = self.db.row_key
        rows = self.db.rows(
            f"SELECT {n}, fact_id, statement, vector, class, subject, lines FROM memory_facts WHERE scope = ? AND "
            f"status = 'live' AND {n} > ?{'' if self.searches_here else f' AND class <> {PASSAGE!r}'} ORDER BY {n}",
            (scope, idx.rowid),
        )
        idx.add_rows(rows)
        return idx

    def search(self, query: str, top_k: int, scopes: Sequence[str], tiers: Sequence[str] = TIERS) -> list[MemoryHit]:
        """The best ``top_k`` live facts and passages (``tiers``) of ``scopes`` for ``query``,
        fused (each kind scored by its own index, BM25 on one scale for all: a fact that
        shares a word with the question does not rank as the best passage does), best first
        (a passage a better hit states already left out)."""
        classes = classes_of(tiers)
        pool = 4 * top_k
        found: list[tuple[float, str, Any]] = []
        with self._lock:
            indexes = [
                index
                for idx in (self._index(scope) for scope in scopes)
                for index, cls in ((idx.index, "fact"), (idx.passages, PASSAGE))
                if classes in (None, cls)
            ]
            for hits in search_together(indexes, query, pool):  # every kind's BM25 on one scale
                found += [(h.score, h.entry.run_id, h) for h in hits]
        found.sort(key=lambda x: -x[0])
        facts = self._by_id([fid for _, fid, _ in found[:pool]])
        return distinct_hits(
            [hit_of(facts[fid], score, cosine=h.cosine, bm25=h.bm25) for score, fid, h in found[:pool]], top_k
        )


def _joined(stored: str | None, more: Sequence[dict[str, Any]]) -> str:
    """A fact's source lines with ``more`` added (a line already kept, by run and seq, once)."""
    lines = json.loads(stored or "[]")
    return json.dumps([*lines, *new_lines(lines, more)], ensure_ascii=False)


class ScopedMemory:
    """Durable memory as one run may read it: only ``granted`` scope keys, checked on every
    call (a :class:`~loomrt.recall.memory.MemorySource`)."""

    def __init__(self, store: DurableMemory, granted: Sequence[str], kinds: Sequence[str] = ()):
        self.store = store
        self.granted = list(granted)
        self._by_kind = dict(zip(kinds, granted, strict=False))

    @property
    def shared(self) -> bool:
        """Whether the memory lives in a shared database (PostgreSQL): a read waits on the
        network and the server's locks, so async callers make it off their event loop."""
        return bool(getattr(self.store, "shared", False))

    def search(self, query: str, top_k: int, scopes: Sequence[str] | None = None) -> list[MemoryHit]:
        """Facts of ``scopes`` (kinds like ``user`` or keys like ``user:alice``; default all
        granted); :class:`~loomrt.harvest.scopes.ScopeError` for one not granted."""
        wanted = self.granted if scopes is None else [self._by_kind.get(s, s) for s in scopes]
        return self.store.search(query, top_k, check(wanted, self.granted, action="read"))
