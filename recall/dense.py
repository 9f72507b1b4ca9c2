"""The dense side of the recall index: one normalised vector per entry, scored by cosine.

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

from typing import Any

import numpy as np

__all__ = ["DenseVectors"]

_SCALE = 127.0
"""Unit-norm components times this, rounded, are the 8-bit codes."""


def _faiss() -> Any:
    import faiss

    faiss.omp_set_num_threads(1)  # single small queries: threads cost more than they save
    return faiss


class DenseVectors:
    """The vectors of the live entries, in entry order, with an 8-bit copy for scans."""

    def __init__(self, dim: int):
        self.dim = dim
        self._rows = np.zeros((1024, dim), dtype=np.float32)
        self._start = 0
        """Row of the oldest live entry (rows before it were dropped and await compaction)."""
        self._end = 0
        self._sum = np.zeros(dim, dtype=np.float64)
        faiss = _faiss()
        self._codes = faiss.IndexScalarQuantizer(
            dim, faiss.ScalarQuantizer.QT_8bit_direct_signed, faiss.METRIC_INNER_PRODUCT
        )

    def __len__(self) -> int:
        return self._end - self._start

    @property
    def live(self) -> np.ndarray:
        """The live vectors, oldest first (a view)."""
        return self._rows[self._start : self._end]

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
        self._codes.add(np.ascontiguousarray(np.rint(vecs * _SCALE), dtype=np.float32))

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
        self._codes.remove_ids(_faiss().IDSelectorRange(0, self._start))
        self._start, self._end = 0, n

    def scores(self, q: np.ndarray) -> np.ndarray:
        """The exact cosine of every live vector with the unit vector ``q``, oldest first."""
        return np.ascontiguousarray(self.live @ q, dtype=np.float32)

    def gather(self, q: np.ndarray, positions: np.ndarray) -> np.ndarray:
        """The exact cosine of the live vectors at ``positions`` (0 = the oldest) with ``q``."""
        return np.ascontiguousarray(self._rows[self._start + positions] @ q, dtype=np.float32)

    def top(self, q: np.ndarray, k: int) -> np.ndarray:
        """Positions (0 = the oldest) of about the best ``k`` live vectors for ``q``, by the
        8-bit codes (approximate: score them with :meth:`gather`)."""
        faiss = _faiss()
        params = faiss.SearchParameters()
        live = faiss.IDSelectorRange(self._start, self._end)
        params.sel = live
        # the scan quantizes the query as it does the vectors (truncating): round it first
        code = np.ascontiguousarray(np.rint(q[None, :] * _SCALE), dtype=np.float32)
        _, ids = self._codes.search(code, min(k, len(self)), params=params)
        found: np.ndarray = ids[0][ids[0] >= 0] - self._start
        return found
