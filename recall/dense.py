"""The dense side of the recall index: normalised vectors, scored by cosine.

:class:`EntryVectors` is what the index holds: one vector per entry and, for a long entry,
one per *passage* (consecutive sentences of about :data:`PASSAGE_WORDS` words,
:func:`passages_of`); an entry's cosine is the best of its own and its passages'. One
sentence that matters in a message of a hundred words of other talk ("Please note that the
booking reference is KG-81170") is otherwise drowned in the message's single vector: on 120
turns of the bench's chat200, the turn that states a fact asked about in other words is in
the dense top 5 for 0.71 of the questions by the turns' own vectors and for 0.96 with
passages (``tests/test_recall_minilm.py`` checks both sides).

Vectors are kept in entry order (ids only grow and the oldest are dropped first, so the
live entries are one contiguous block of rows). Two ways to score a query:

- :meth:`DenseVectors.scores`: the exact cosine of every entry, one matrix-vector
  product (what the index uses while it is small);
- :meth:`DenseVectors.top`: the best ``k`` rows by an 8-bit copy of the vectors, which
  a FAISS scalar-quantizer scan reads at a quarter of the memory traffic (what a large
  index uses to find its dense candidates, then scored exactly with :meth:`gather`).

:attr:`DenseVectors.centroid` is the mean vector of the live entries, kept as they come
and go, so the mean cosine over the whole index is one dot product.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = ["DenseVectors", "EntryVectors", "passages_of", "PASSAGE_WORDS", "IVF_MIN"]

PASSAGE_WORDS = 24
"""About how many words a passage holds; a text of fewer than twice as many words
gets none (its own vector is as sharp)."""

_SENTENCE_END = re.compile(r"(?<=[.!?])\s+|\n+")

_SCALE = 127.0
"""Unit-norm components times this, rounded, are the 8-bit codes."""


def _faiss() -> Any:
    import faiss

    faiss.omp_set_num_threads(1)  # single small queries: threads cost more than they save
    return faiss


IVF_MIN = 32_768
"""From this many vectors on, :meth:`DenseVectors.top` scans only the codes of the clusters
nearest the query (one in :data:`IVF_PROBE` of an inverted file's clusters): approximate, so
below it every code is scanned. What it costs in results is measured by
``loomrt bench run recall_clusters`` (on 24,000 MiniLM vectors: the same top 5 as scoring
every entry for all 64 queries)."""

IVF_PROBE = 4
"""One cluster in this many is scanned (the nearest to the query)."""


def _clusters(n: int) -> int:
    """How many clusters an inverted file of ``n`` vectors is trained with: a power of two
    near ``√n`` (256 at 32,768 vectors: 128 a cluster when trained, up to 512 before it is
    trained again at four times as many)."""
    return 1 << max(4, int(math.log2(math.sqrt(n)) + 0.5))


class DenseVectors:
    """The vectors of the live entries, in entry order, with an 8-bit copy for scans: a
    flat one, or from :data:`IVF_MIN` vectors on an inverted file of clusters."""

    def __init__(self, dim: int, *, ivf_min: int = IVF_MIN):
        self.dim = dim
        self.ivf_min = ivf_min
        """From this many live vectors on, the codes are an inverted file (see :data:`IVF_MIN`)."""
        self._rows = np.zeros((1024, dim), dtype=np.float32)
        self._start = 0
        """Row of the oldest live entry (rows before it were dropped and await compaction)."""
        self._end = 0
        self._offset = 0
        """How many rows compaction has removed before row 0: an inverted file's ids are
        rows counted from the first vector ever added."""
        self._sum = np.zeros(dim, dtype=np.float64)
        self._codes: Any = self._flat_codes()
        self._quantizer: Any = None
        self._trained = 0
        """How many vectors the inverted file was trained on (0: the codes are flat)."""

    def _flat_codes(self) -> Any:
        faiss = _faiss()
        return faiss.IndexScalarQuantizer(
            self.dim, faiss.ScalarQuantizer.QT_8bit_direct_signed, faiss.METRIC_INNER_PRODUCT
        )

    def __len__(self) -> int:
        return self._end - self._start

    @property
    def live(self) -> np.ndarray:
        """The live vectors, oldest first (a view)."""
        return self._rows[self._start : self._end]

    @property
    def clustered(self) -> bool:
        """Whether :meth:`top` scans an inverted file (approximate: the nearest clusters only)."""
        return self._trained > 0

    @property
    def centroid(self) -> np.ndarray:
        """The mean of the live vectors (zeros when there are none)."""
        n = len(self)
        return (self._sum / n).astype(np.float32) if n else np.zeros(self.dim, dtype=np.float32)

    def add(self, vecs: np.ndarray) -> None:
        """Append vectors (shape ``(m, dim)``, float32) as the newest entries."""
        m = len(vecs)
        if self._end + m > len(self._rows):
            self._compact()
            if self._end + m > len(self._rows):
                grown = np.zeros((max(self._end + m, 2 * len(self._rows)), self.dim), dtype=np.float32)
                grown[: self._end] = self._rows[: self._end]
                self._rows = grown
        self._rows[self._end : self._end + m] = vecs
        self._end += m
        self._sum += vecs.sum(axis=0, dtype=np.float64)
        if len(self) >= max(self.ivf_min, 4 * self._trained):
            self._cluster()  # (again, at four times the vectors it was trained on)
        elif self._trained:
            ids = np.arange(self._offset + self._end - m, self._offset + self._end, dtype=np.int64)
            self._codes.add_with_ids(_code(vecs), ids)
        else:
            self._codes.add(_code(vecs))

    def _cluster(self) -> None:
        """Train an inverted file on the live vectors and put every one's code in it."""
        faiss = _faiss()
        n = len(self)
        quantizer = faiss.IndexFlatIP(self.dim)
        codes = faiss.IndexIVFScalarQuantizer(
            quantizer, self.dim, _clusters(n), faiss.ScalarQuantizer.QT_8bit_direct_signed, faiss.METRIC_INNER_PRODUCT
        )
        codes.by_residual = False  # the codes are the vectors' own 8-bit components
        codes.cp.niter = 10
        codes.cp.max_points_per_centroid = 64  # a sample of at most 64 vectors a cluster
        codes.cp.seed = 1234
        live = _code(self.live)
        codes.train(live)
        codes.add_with_ids(live, np.arange(self._offset + self._start, self._offset + self._end, dtype=np.int64))
        self._codes, self._quantizer, self._trained = codes, quantizer, n  # (the file does not own its quantizer)

    def drop_oldest(self, count: int) -> None:
        """Forget the ``count`` oldest vectors."""
        count = min(count, len(self))
        self._sum -= self._rows[self._start : self._start + count].sum(axis=0, dtype=np.float64)
        self._start += count
        if not len(self):
            self._sum[:] = 0.0  # no drift carried into the next vectors
        if self._start > max(1024, len(self) // 4):
            self._compact()

    def _compact(self) -> None:
        """Move the live rows to the front (and drop the codes of the dropped ones)."""
        if not self._start:
            return
        n = len(self)
        self._rows[:n] = self._rows[self._start : self._end]
        if self._trained:  # ids stay as they are
            self._codes.remove_ids(_faiss().IDSelectorRange(self._offset, self._offset + self._start))
        else:  # the remaining codes are renumbered from 0
            self._codes.remove_ids(_faiss().IDSelectorRange(0, self._start))
        self._offset += self._start
        self._start, self._end = 0, n

    def scores(self, q: np.ndarray) -> np.ndarray:
        """The exact cosine of every live vector with the unit vector ``q``, oldest first."""
        return np.ascontiguousarray(self.live @ q, dtype=np.float32)

    def gather(self, q: np.ndarray, positions: np.ndarray) -> np.ndarray:
        """The exact cosine of the live vectors at ``positions`` (0 = the oldest) with ``q``."""
        return np.ascontiguousarray(self._rows[self._start + positions] @ q, dtype=np.float32)

    def top(self, q: np.ndarray, k: int) -> np.ndarray:
        """Positions (0 = the oldest) of about the best ``k`` live vectors for ``q``, by the
        8-bit codes (approximate: score them with :meth:`gather`; and once :attr:`clustered`,
        the best of the nearest clusters only)."""
        if not len(self) or k < 1:
            return np.zeros(0, dtype=np.int64)
        faiss = _faiss()
        first = (self._offset if self._trained else 0) + self._start
        if self._trained:
            params = faiss.SearchParametersIVF()
            params.nprobe = max(1, self._codes.nlist // IVF_PROBE)
        else:
            params = faiss.SearchParameters()
        live = faiss.IDSelectorRange(first, first + len(self))
        params.sel = live
        _, ids = self._codes.search(_code(q[None, :]), min(k, len(self)), params=params)
        found: np.ndarray = ids[0][ids[0] >= 0] - first
        return found


def _code(vecs: np.ndarray) -> np.ndarray:
    """Unit vectors as the scan's input: times :data:`_SCALE`, rounded (the scan truncates,
    so a query is rounded as the vectors are)."""
    return np.ascontiguousarray(np.rint(vecs * _SCALE), dtype=np.float32)


def passages_of(text: str, words: int = PASSAGE_WORDS) -> list[str]:
    """``text``'s sentences (or lines) joined into passages of at least ``words`` words, in
    order (a short last one joins the passage before it); none for a text under ``2 * words``
    words, or one that would make a single passage."""
    if len(text.split()) < 2 * words:
        return []
    out: list[str] = []
    current: list[str] = []
    size = 0
    for sentence in _SENTENCE_END.split(text):
        if not sentence.strip():
            continue
        current.append(sentence.strip())
        size += len(sentence.split())
        if size >= words:
            out.append(" ".join(current))
            current, size = [], 0
    if current:
        if out and size < words // 2:
            out[-1] = f"{out[-1]} {' '.join(current)}"
        else:
            out.append(" ".join(current))
    return out if len(out) > 1 else []


class EntryVectors:
    """Each live entry's vector, and its passages' vectors, in entry order; an entry scores
    the best cosine of its own vector and its passages'.

    Entries are counted by position (0 = the oldest live one), as :class:`DenseVectors`
    counts rows; the passages of an entry are contiguous rows of a second
    :class:`DenseVectors`, with the entry each belongs to (an absolute count of entries
    added) beside them.
    """

    def __init__(self, dim: int, *, ivf_min: int = IVF_MIN):
        self.dim = dim
        self.whole = DenseVectors(dim, ivf_min=ivf_min)
        self.passages = DenseVectors(dim, ivf_min=ivf_min)
        self._owner = np.zeros(1024, dtype=np.int64)
        self._o_start = 0
        self._o_end = 0
        self._added = 0
        """Entries added so far (the absolute number of the next one)."""
        self._dropped = 0
        """Entries dropped so far (the absolute number of the oldest live one)."""

    def __len__(self) -> int:
        return len(self.whole)

    @property
    def centroid(self) -> np.ndarray:
        """The mean of the entries' own vectors."""
        return self.whole.centroid

    @property
    def owners(self) -> np.ndarray:
        """The live passages' entries, as positions (0 = the oldest live entry)."""
        return self._owner[self._o_start : self._o_end] - self._dropped

    def add(self, vecs: np.ndarray, passages: np.ndarray, counts: Sequence[int]) -> None:
        """Append entries' vectors, and their passages' (``counts[i]`` passages for the i-th
        entry, in order)."""
        owners = np.repeat(
            np.arange(self._added, self._added + len(vecs), dtype=np.int64), np.asarray(counts, dtype=np.int64)
        )
        if len(passages) != len(owners):
            raise ValueError(f"{len(passages)} passage vectors for {len(owners)} passages")
        self.whole.add(vecs)
        self._added += len(vecs)
        if not len(owners):
            return
        self.passages.add(passages)
        m = len(owners)
        if self._o_end + m > len(self._owner):
            live = self._owner[self._o_start : self._o_end]
            grown = np.zeros(max(2 * len(self._owner), len(live) + m), dtype=np.int64)
            grown[: len(live)] = live
            self._owner, self._o_start, self._o_end = grown, 0, len(live)
        self._owner[self._o_end : self._o_end + m] = owners
        self._o_end += m

    def drop_oldest(self, count: int) -> None:
        """Forget the ``count`` oldest entries and their passages."""
        count = min(count, len(self))
        self.whole.drop_oldest(count)
        self._dropped += count
        gone = int(np.searchsorted(self._owner[self._o_start : self._o_end], self._dropped))
        self.passages.drop_oldest(gone)
        self._o_start += gone

    def scores(self, q: np.ndarray) -> np.ndarray:
        """Every live entry's best cosine with the unit vector ``q``, oldest first."""
        cos = self.whole.scores(q)
        if len(self.passages):
            owners = self.owners
            starts = np.flatnonzero(np.r_[True, owners[1:] != owners[:-1]])
            best = np.maximum.reduceat(self.passages.scores(q), starts)
            at = owners[starts]
            cos[at] = np.maximum(cos[at], best)
        return cos

    def gather(self, q: np.ndarray, positions: np.ndarray) -> np.ndarray:
        """The best cosine of the live entries at ``positions`` with ``q``."""
        cos = self.whole.gather(q, positions)
        if len(self.passages) and len(positions):
            owners = self.owners
            lo, hi = np.searchsorted(owners, positions), np.searchsorted(owners, positions, side="right")
            has = np.flatnonzero(hi > lo)
            if len(has):
                sizes = hi[has] - lo[has]
                rows = np.repeat(lo[has] - np.cumsum(np.r_[0, sizes[:-1]]), sizes) + np.arange(int(sizes.sum()))
                best = np.maximum.reduceat(self.passages.gather(q, rows), np.r_[0, np.cumsum(sizes)[:-1]])
                cos[has] = np.maximum(cos[has], best)
        return cos

    def top(self, q: np.ndarray, k: int) -> tuple[np.ndarray, float]:
        """About the best ``k`` entries by their own codes and the entries of about the best
        ``k`` passages by theirs (positions, unique), and the exact cosine no entry outside
        them can pass by more than the codes' margin: the weakest of the candidates' own
        vectors, or of the candidate passages, whichever is higher."""
        own = self.whole.top(q, k)
        weakest = float(self.whole.gather(q, own).min()) if len(own) else -1.0
        if not len(self.passages):
            return own, weakest
        rows = self.passages.top(q, k)
        if len(rows):
            weakest = max(weakest, float(self.passages.gather(q, rows).min()))
        return np.union1d(own, self.owners[rows]), weakest
