"""An incremental BM25 index: adding or removing a document costs its own tokens, never a
rebuild, so the first query after an eviction, or the first query of a term, is as fast as
any other.

Scoring is Lucene's BM25 (the variant ``bm25s`` uses by default)::

    idf(t)     = ln(1 + (N - df(t) + 0.5) / (df(t) + 0.5))
    score(d,q) = Σ_{t in q} idf(t) · tf(t,d) / (tf(t,d) + k1 · (1 - b + b · |d| / avgdl))

with k1 = 1.5 and b = 0.75. Documents are keyed by int ids; :meth:`scores` returns an
array aligned to any order of ids the caller keeps.

Each term's postings are growable arrays (documents and their tf) that a query scores in a
few vectorised operations. Adding a document appends to its terms' arrays; replacing one
rewrites its tf and length in the slots it keeps; removing one zeroes its tf in place (a
zero tf scores nothing), and a term's arrays are compacted once
a quarter of their slots are dead. Earlier the arrays were built lazily from dicts at a term's first
query: at 100,000 documents a common term's first query took milliseconds per index, which
was most of Recall's p95.
"""

from __future__ import annotations

import math
from array import array
from bisect import bisect_left
from collections import Counter
from collections.abc import Iterable, Sequence

import numpy as np

__all__ = ["IncrementalBM25", "TermStats"]

TermStats = tuple[int, int, dict[str, int]]
"""Documents, their total length, and each query term's document frequency: what BM25
weighs a term and a length by (:meth:`IncrementalBM25.term_stats`; summed over several
indexes, one scale for them all)."""


class _Postings:
    """One term's documents, their tf and their lengths, in slots; a removed document's slot
    has tf 0.

    The slots are :class:`array.array` (an append costs what a list's does); a query reads
    them as NumPy views, without a copy. A document's length is kept in each of its slots
    so that a query reads it in order (gathering it from a table by document took a third
    of a common term's scoring)."""

    __slots__ = ("docs", "tf", "lengths", "slot", "ordered")

    def __init__(self) -> None:
        self.docs = array("q")
        self.tf = array("f")
        self.lengths = array("f")
        self.slot: dict[int, int] = {}
        """Live document → its slot."""
        self.ordered = True
        """Whether every slot's document is greater than the slot's before it (documents
        added in the order of their ids, none added twice)."""

    def compact(self) -> None:
        """Drop the dead slots (those of removed documents)."""
        docs, tf, lengths = self.arrays()
        live = np.flatnonzero(tf > 0)
        self.docs, self.tf = array("q", docs[live].tobytes()), array("f", tf[live].tobytes())
        self.lengths = array("f", lengths[live].tobytes())
        self.slot = dict(zip(docs[live].tolist(), range(len(live)), strict=True))

    def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The slots as NumPy views (valid until the next change)."""
        return (
            np.frombuffer(self.docs, dtype=np.int64),
            np.frombuffer(self.tf, dtype=np.float32),
            np.frombuffer(self.lengths, dtype=np.float32),
        )


_INSERT_MAX = 64
"""How many slots a document may go in before the end of a term's slots (kept in order)."""


def _append(p: _Postings, doc: int, tf: int, length: int) -> None:
    """A slot for ``doc`` after the last of ``p``'s, or in its place among the last
    :data:`_INSERT_MAX` (the neighbourhood index gives its newest documents new terms);
    further back, the slots are no longer in order."""
    docs = p.docs
    if docs and doc <= docs[-1] and p.ordered:
        lo = max(0, len(docs) - _INSERT_MAX)
        at = bisect_left(docs, doc, lo)
        if at == lo and lo > 0 and docs[lo - 1] >= doc:
            p.ordered = False
        elif docs[at] == doc:  # its own dead slot
            p.slot[doc] = at
            p.tf[at], p.lengths[at] = tf, length
            return
        else:
            docs.insert(at, doc)
            p.tf.insert(at, tf)
            p.lengths.insert(at, length)
            for j in range(at + 1, len(docs)):  # the live slots after it moved up one
                later = docs[j]
                if p.slot.get(later) == j - 1:
                    p.slot[later] = j
            p.slot[doc] = at
            return
    elif docs and doc <= docs[-1]:
        p.ordered = False
    p.slot[doc] = len(docs)
    docs.append(doc)
    p.tf.append(tf)
    p.lengths.append(length)


class IncrementalBM25:
    """BM25 over documents that come and go one at a time."""

    def __init__(self, *, k1: float = 1.5, b: float = 0.75):
        self.k1, self.b = k1, b
        self._postings: dict[str, _Postings] = {}
        self._lengths: dict[int, int] = {}
        self._total = 0
        self._gain = np.empty(0, dtype=np.float32)
        self._at = np.empty(0, dtype=np.int64)

    def __len__(self) -> int:
        return len(self._lengths)

    def __contains__(self, doc: int) -> bool:
        return doc in self._lengths

    def idf(self, term: str) -> float:
        """The inverse document frequency of ``term`` (0.0 when no document holds it)."""
        p, n = self._postings.get(term), len(self._lengths)
        df = len(p.slot) if p is not None else 0
        return math.log(1 + (n - df + 0.5) / (df + 0.5)) if df and n else 0.0

    def add(self, doc: int, tokens: Sequence[str], *, old: Iterable[str] | None = None) -> None:
        """Add document ``doc`` (a non-negative int), or replace it: ``old``, its tokens
        until now if given, spares a scan of the vocabulary.

        A replaced document keeps its slot in each term it keeps (its tf and length are
        rewritten there), so the slots stay in the order of their documents: the neighbourhood
        index replaces its newest documents after every addition, and a term whose slots
        fell out of order is scored by a scatter, not a slice."""
        if doc in self._lengths:
            self._replace(doc, tokens, old)
            return
        length = len(tokens)
        postings = self._postings
        for term, tf in Counter(tokens).items():  # the hot loop of indexing
            p = postings.get(term)
            if p is None:
                p = postings[term] = _Postings()
            docs = p.docs
            if docs and doc <= docs[-1]:
                _append(p, doc, tf, length)
                continue
            p.slot[doc] = len(docs)  # after the last slot: _append's common case, inlined
            docs.append(doc)
            p.tf.append(tf)
            p.lengths.append(length)
        self._lengths[doc] = length
        self._total += length

    def _replace(self, doc: int, tokens: Sequence[str], old: Iterable[str] | None) -> None:
        length = len(tokens)
        counts = Counter(tokens)
        postings = self._postings
        for term in self._terms(doc, old):
            if term not in counts:
                self._drop(term, doc)
        for term, tf in counts.items():
            p = postings.get(term)
            at = p.slot.get(doc) if p is not None else None
            if p is None:
                p = postings[term] = _Postings()
            if at is None:
                _append(p, doc, tf, length)
            else:
                p.tf[at], p.lengths[at] = tf, length
        self._total += length - self._lengths[doc]
        self._lengths[doc] = length

    def remove(self, doc: int, tokens: Iterable[str] | None = None) -> None:
        """Remove document ``doc`` (``tokens``, if given, spares a scan of the vocabulary)."""
        length = self._lengths.pop(doc, None)
        if length is None:
            return
        self._total -= length
        for term in self._terms(doc, tokens):
            self._drop(term, doc)

    def _terms(self, doc: int, tokens: Iterable[str] | None) -> Iterable[str]:
        """``doc``'s terms: those of ``tokens`` if given, else a scan of the vocabulary."""
        return set(tokens) if tokens is not None else [t for t, p in self._postings.items() if doc in p.slot]

    def _drop(self, term: str, doc: int) -> None:
        """Kill ``doc``'s slot in ``term``'s postings (tf 0), compacting them once a quarter
        of their slots are dead, and dropping them with their last live slot."""
        p = self._postings.get(term)
        if p is None:
            return
        at = p.slot.pop(doc, None)
        if at is None:
            return
        if not p.slot:
            del self._postings[term]
            return
        p.tf[at] = 0.0
        slots = len(p.docs)
        if slots > 64 and 4 * (slots - len(p.slot)) > slots:
            p.compact()

    def _scratch(self, m: int) -> tuple[np.ndarray, np.ndarray]:
        """Work arrays of ``m`` slots (float32 gains, int64 positions), kept between queries:
        a fresh temporary of 100,000 slots costs more to allocate than to fill."""
        if len(self._gain) < m:
            self._gain = np.empty(max(m, 2 * len(self._gain)), dtype=np.float32)
            self._at = np.empty(len(self._gain), dtype=np.int64)
        return self._gain[:m], self._at[:m]

    def term_stats(self, terms: Iterable[str]) -> TermStats:
        """This index's documents, their total length, and the document frequency of each of
        ``terms``."""
        return len(self._lengths), self._total, {t: len(p.slot) for t in set(terms) if (p := self._postings.get(t))}

    def scores(
        self,
        query: Sequence[str],
        position: dict[int, int] | None,
        size: int,
        *,
        first: int = 0,
        stats: TermStats | None = None,
    ) -> np.ndarray:
        """BM25 of every document for ``query``, as an array of ``size``: document ``d`` lands
        at ``position[d]``, or at ``d - first`` when ``position`` is None (contiguous ids).
        ``stats`` (several indexes' summed :meth:`term_stats`) weigh the terms and lengths
        in place of this index's own."""
        out = np.zeros(size, dtype=np.float32)
        n = len(self._lengths)
        if not n or not query:
            return out
        total = self._total
        if stats is not None:
            n, total = stats[0], stats[1]
        avgdl = total / n if total else 1.0
        k1, b = self.k1, self.b
        per_length, base = np.float32(k1 * b / avgdl), np.float32(k1 * (1 - b))
        for term, count in Counter(query).items():
            p = self._postings.get(term)
            if p is None:
                continue
            df = len(p.slot) if stats is None else stats[2].get(term, len(p.slot))
            idf = math.log(1 + (n - df + 0.5) / (df + 0.5))
            docs, tf, lengths = p.arrays()
            if position is not None:  # only live slots: a removed document has no position
                live = tf > 0
                docs, tf, lengths = docs[live], tf[live], lengths[live]
            elif p.ordered:  # the documents before ``first`` are all removed ones
                lo = int(np.searchsorted(docs, first))
                docs, tf, lengths = docs[lo:], tf[lo:], lengths[lo:]
            if not len(docs):
                continue
            gain, at = self._scratch(len(docs))
            # gain = count·idf · tf / (tf + k1·(1 - b + b·|d|/avgdl)), in place
            np.multiply(lengths, per_length, out=gain)
            gain += base
            gain += tf
            np.divide(tf, gain, out=gain)
            gain *= np.float32(count * idf)
            if position is not None:
                at = np.fromiter((position[d] for d in docs.tolist()), dtype=np.int64, count=len(docs))
            elif p.ordered and docs[-1] - docs[0] == len(docs) - 1:
                # one run of consecutive documents (a term in every one of them, as a line
                # every log entry repeats): added as a slice, a fifth of the time of a scatter
                start = int(docs[0]) - first
                out[start : start + len(docs)] += gain
                continue
            else:
                np.subtract(docs, first, out=at)
                if not p.ordered:  # a removed document's slot adds 0, wherever it lands
                    np.maximum(at, 0, out=at)
            np.add.at(out, at, gain)
        return out
