"""An incremental BM25 index: adding or removing a document costs its own tokens, never a
rebuild, so the first query after an eviction is as fast as any other.

Scoring is Lucene's BM25 (the variant ``bm25s`` uses by default)::

    idf(t)     = ln(1 + (N - df(t) + 0.5) / (df(t) + 0.5))
    score(d,q) = Σ_{t in q} idf(t) · tf(t,d) / (tf(t,d) + k1 · (1 - b + b · |d| / avgdl))

with k1 = 1.5 and b = 0.75. Documents are keyed by int ids; :meth:`scores` returns an
array aligned to any order of ids the caller keeps.

A term's postings are kept twice: as a dict (the truth, updated document by document) and,
once the term has been queried, as arrays for vectorised scoring. A change to a queried
term is queued against its arrays and applied at its next query with a few array
operations (the last change of each document wins), instead of rebuilding the arrays from
the dict: at 100,000 documents a common term's rebuild took milliseconds per query.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Sequence

import numpy as np

__all__ = ["IncrementalBM25"]


class IncrementalBM25:
    """BM25 over documents that come and go one at a time."""

    def __init__(self, *, k1: float = 1.5, b: float = 0.75):
        self.k1, self.b = k1, b
        self._postings: dict[str, dict[int, int]] = {}
        self._lengths: dict[int, int] = {}
        self._doclen = np.zeros(1024, dtype=np.float32)
        """Document lengths by id (ids are non-negative ints), for vectorised scoring."""
        self._total = 0
        self._arrays: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
        """Per queried term: its documents, their tf and their lengths as arrays."""
        self._changes: dict[str, dict[int, int]] = {}
        """Per queried term: documents added (their tf) or removed (0) since its arrays were built."""

    def __len__(self) -> int:
        return len(self._lengths)

    def __contains__(self, doc: int) -> bool:
        return doc in self._lengths

    def add(self, doc: int, tokens: Sequence[str]) -> None:
        """Add (or replace) document ``doc`` (a non-negative int)."""
        if doc in self._lengths:
            self.remove(doc)
        if doc >= len(self._doclen):
            grown = np.zeros(max(doc + 1, 2 * len(self._doclen)), dtype=np.float32)
            grown[: len(self._doclen)] = self._doclen
            self._doclen = grown
        self._doclen[doc] = len(tokens)
        for term, tf in Counter(tokens).items():
            self._postings.setdefault(term, {})[doc] = tf
            self._change(term, doc, tf)
        self._lengths[doc] = len(tokens)
        self._total += len(tokens)

    def remove(self, doc: int, tokens: Iterable[str] | None = None) -> None:
        """Remove document ``doc`` (``tokens``, if given, spares a scan of the vocabulary)."""
        length = self._lengths.pop(doc, None)
        if length is None:
            return
        self._total -= length
        terms = set(tokens) if tokens is not None else [t for t, p in self._postings.items() if doc in p]
        for term in terms:
            posting = self._postings.get(term)
            if posting is not None and posting.pop(doc, None) is not None:
                self._change(term, doc, 0)
                if not posting:
                    del self._postings[term]
                    self._arrays.pop(term, None)
                    self._changes.pop(term, None)

    def _change(self, term: str, doc: int, tf: int) -> None:
        if term not in self._arrays:
            return  # never queried: its arrays are built from the dict when it is
        changes = self._changes.setdefault(term, {})
        changes[doc] = tf
        if len(changes) > 64 and len(changes) > len(self._arrays[term][0]) // 2:
            del self._arrays[term], self._changes[term]  # cheaper to rebuild than to patch

    def scores(self, query: Sequence[str], position: dict[int, int] | None, size: int, *, first: int = 0) -> np.ndarray:
        """BM25 of every document for ``query``, as an array of ``size``: document ``d`` lands
        at ``position[d]``, or at ``d - first`` when ``position`` is None (contiguous ids)."""
        out = np.zeros(size, dtype=np.float32)
        n = len(self._lengths)
        if not n or not query:
            return out
        avgdl = self._total / n if self._total else 1.0
        k1, b = self.k1, self.b
        for term, count in Counter(query).items():
            posting = self._postings.get(term)
            if not posting:
                continue
            df = len(posting)
            idf = math.log(1 + (n - df + 0.5) / (df + 0.5))
            docs, tf, lengths = self._term_arrays(term, posting)
            gain = (count * idf) * tf / (tf + k1 * (1 - b + b * lengths / avgdl))
            at = docs - first if position is None else np.fromiter((position[d] for d in docs.tolist()), dtype=np.int64, count=len(docs))
            np.add.at(out, at, gain)
        return out

    def _term_arrays(self, term: str, posting: dict[int, int]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        arrays = self._arrays.get(term)
        changes = self._changes.pop(term, None)
        if arrays is not None and changes:
            docs, tf, lengths = arrays
            touched = np.fromiter(changes.keys(), dtype=np.int64, count=len(changes))
            keep = ~np.isin(docs, touched)
            added = [(d, t) for d, t in changes.items() if t]
            new_docs = np.fromiter((d for d, _ in added), dtype=np.int64, count=len(added))
            new_tf = np.fromiter((t for _, t in added), dtype=np.float32, count=len(added))
            arrays = self._arrays[term] = (np.concatenate([docs[keep], new_docs]), np.concatenate([tf[keep], new_tf]),
                                           np.concatenate([lengths[keep], self._doclen[new_docs]]))
        elif arrays is None:
            df = len(posting)
            docs = np.fromiter(posting.keys(), dtype=np.int64, count=df)
            tf = np.fromiter(posting.values(), dtype=np.float32, count=df)
            arrays = self._arrays[term] = (docs, tf, self._doclen[docs])
        return arrays
