"""The run-scoped recall index: entries, dense (faiss) and lexical (BM25) search, fusion.

One :class:`Entry` per evicted message (long messages become overlapping chunks that
each point at their message). Each entry is matched two ways, on two texts:

- dense: all-MiniLM-L6-v2 vectors (normalised, inner product = cosine) kept in entry
  order (:class:`~loomrt.recall.dense.EntryVectors`; ids only increase, so the FIFO cap
  drops the oldest rows), one per entry and one per passage of a long entry (the
  entry scores its best), scored exactly up to :data:`EXACT_MAX` entries and, past it, on
  candidates picked by an 8-bit scan and the lexical scores (the same top ``k``); from
  :data:`~loomrt.recall.dense.IVF_MIN` vectors on, the scan reads the nearest quarter of
  the vectors' clusters only, so the top ``k`` is approximate there;
- lexical: BM25 (:class:`~loomrt.recall.bm25.IncrementalBM25`) over tokens that keep exact values whole (paths, ids, numbers,
  ``host:port``) beside their parts, with English stopwords dropped and words stemmed.

Lexical matching scores the entry itself (speaker and text), its *window* (the message
before it, then the entry, because a message often only makes sense as an answer to the
one before: "where did you go?" / "Lisbon") and its *neighbourhood* (a few entries on each
side). The four signals are scaled per query and fused by weight (:class:`Fusion`);
results come back best first. Tokens are computed once, when an entry is added, and every
BM25 index is updated entry by entry (an eviction never makes the next query rebuild).
"""

from __future__ import annotations

import re
from collections import Counter, OrderedDict
from collections.abc import Sequence
from contextlib import nullcontext
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Any

import numpy as np

from loomrt.recall.bm25 import IncrementalBM25, TermStats
from loomrt.recall.dense import IVF_MIN, EntryVectors, passages_of
from loomrt.recall.embedders import Embedder

__all__ = [
    "Entry",
    "Hit",
    "RecallIndex",
    "Fusion",
    "tokenize",
    "chunk_text",
    "search_together",
    "SharedScale",
    "EXACT_MAX",
    "CANDIDATES",
    "CHUNK_WORDS",
    "CHUNK_OVERLAP",
]

EXACT_MAX = 16_384
"""Up to this many entries the dense side scores every entry exactly. Past it, a scan of
8-bit codes picks :data:`CANDIDATES` dense candidates, the lexical scores pick as many, and
only those (and any other entry whose lexical score could still reach the top) are scored
exactly: the same top ``k`` for a fraction of the memory traffic."""

CANDIDATES = 64
"""Dense and lexical candidates each, on a large index."""

_CODE_MARGIN = 0.03
"""How far an entry outside the dense candidates may lie above the weakest of them in
cosine: the scan rounds the vectors and the query to 8 bits (0.5/127 per component), which
moves a cosine by about 0.005 (and by 0.015 at the very most, over 100,000 entries)."""


@lru_cache(maxsize=1)
def _blas() -> Any:
    try:
        from threadpoolctl import ThreadpoolController
    except ImportError:
        return None
    return ThreadpoolController()


def _one_blas_thread() -> Any:
    """A context in which NumPy's BLAS runs on the calling thread only. A query's products
    are small; a second BLAS thread woken for one of them spins on the other core for a
    while after it, against the query embedding's own threads: on two cores that made one
    Recall in ten at 100,000 entries take 100 ms instead of 25."""
    controller = _blas()
    return controller.limit(limits=1, user_api="blas") if controller is not None else nullcontext()


@dataclass(frozen=True)
class Entry:
    """One searchable piece of an evicted message (the whole message, or one chunk of it)."""

    id: int
    """Index id; only ever increases within a run."""
    run_id: str
    """The run whose record holds the message."""
    seq: int | None
    """The record seq of the message."""
    distillation_seq: int
    """The seq of the distillation event that evicted it."""
    role: str
    """user, assistant or tool."""
    text: str
    """The original text, verbatim (for a chunk: its verbatim slice of the message)."""
    speaker: str | None = None
    """Who wrote it, where known (a name, or the role)."""
    ts: float | None = None
    """Unix time the message was recorded."""
    tools: tuple[str, ...] = ()
    """Names of the tools the message called, or the tool whose result it is."""
    chunk: int = 0
    """Which chunk of the message this is (0-based)."""
    chunks: int = 1
    """How many chunks the message was split into."""
    before: str = ""
    """The text of the message before it (for matching only; never returned)."""

    @property
    def seqs(self) -> list[int]:
        """The record seqs this entry came from."""
        return [self.seq] if self.seq is not None else []

    @property
    def label(self) -> str:
        """``speaker: text`` as it is matched."""
        who = self.speaker or self.role
        if self.role == "tool":
            who = f"tool {self.tools[0] if self.tools else ''} result".replace("  ", " ")
        return f"{who}: {self.text}"

    @property
    def window(self) -> str:
        """The message before it, then the entry (for matching only)."""
        return f"{self.before}\n{self.label}" if self.before else self.label


@dataclass(frozen=True)
class Hit:
    """One search result: an entry and its fused score in (0, 1].

    The fused score is scaled per query (the best hit is always near 1, but for indexes
    searched together: :func:`search_together`); ``cosine`` and
    ``bm25`` are the hit's raw scores, which say how good the best hit really is (recall
    injection's relevance floor reads them)."""

    entry: Entry
    score: float
    cosine: float | None = None
    """The raw cosine of the query with the entry (its best passage); None without dense search."""
    bm25: float = 0.0
    """The raw BM25 score of the entry alone (speaker and text) for the query (of its window
    in an index that weighs only the window: durable memory's passages)."""


@dataclass(frozen=True)
class Fusion:
    """How the ranked signals are weighed against each other.

    Each signal is scaled to [0, 1] per query: BM25 by the best score, cosine by
    ``(cos - mean) / (best - mean)`` over the whole index. The fused score is their
    weighted sum divided by the sum of the weights in use. Measured on LoCoMo (see
    docs/recall.md), this beats reciprocal rank fusion, which lets the weaker dense
    list pull down the stronger lexical one.
    """

    dense: float = 0.5
    """Cosine between the query and the entry (speaker: text)."""
    lexical: float = 0.5
    """BM25 on the entry alone."""
    lexical_window: float = 1.0
    """BM25 on the entry's window (the message before it, then the entry)."""
    lexical_context: float = 0.5
    """BM25 on the entry's neighbourhood: the ``context_radius`` entries before and after it."""
    context_radius: int = 5
    """How many entries on each side make an entry's neighbourhood."""


# --------------------------------------------------------------------------- text


_COMPOUND = re.compile(r"\w+(?:[./:\\@#+-]+\w+)+")
_WORD = re.compile(r"\w+")
_STOPWORDS = frozenset(
    """a about above after again against all am an and any are as at be because been before being below
    between both but by can could did do does doing down during each few for from further had has have having
    he her here hers herself him himself his how i if in into is it its itself just me more most my myself no
    nor not now of off on once only or other our ours ourselves out over own same she should so some such than
    that the their theirs them themselves then there these they this those through to too under until up very
    was we were what when where which while who whom why will with would you your yours yourself yourselves
    did does hey hi oh yeah yes ok okay really also got get gets thanks thank thx please sure great cool nice
    fine hello bye goodbye yep nope hmm alright""".split()
)


@lru_cache(maxsize=1)
def _stemmer() -> Any:
    try:
        import Stemmer  # PyStemmer (optional): Snowball English

        return Stemmer.Stemmer("english")
    except ImportError:
        return None


@lru_cache(maxsize=200_000)
def _stem(word: str) -> str:
    stemmer = _stemmer()
    if stemmer is not None:
        return str(stemmer.stemWord(word))
    for suffix in ("ing", "edly", "ed", "ies", "es", "s", "ly"):
        if len(word) > len(suffix) + 3 and word.endswith(suffix):
            return word[: -len(suffix)]
    return word


def tokenize(text: str) -> list[str]:
    """BM25 tokens: exact compounds whole (``/etc/app.conf``, ``ERR-4471``, ``10.0.0.7:5432``)
    plus their parts; words lower-cased and stemmed, English stopwords dropped."""
    text = text.lower()
    tokens = [m.group(0) for m in _COMPOUND.finditer(text)]
    for w in _WORD.findall(text):
        if w in _STOPWORDS or (len(w) == 1 and not w.isdigit()):
            continue
        tokens.append(w if w.isdigit() else _stem(w))
    return tokens


CHUNK_WORDS = 160
"""About how many words one chunk of a long message holds."""
CHUNK_OVERLAP = 40
"""How many words each chunk shares with the one before it."""


def chunk_text(text: str, *, words: int = CHUNK_WORDS, overlap: int = CHUNK_OVERLAP) -> list[str]:
    """Split ``text`` into verbatim slices of about ``words`` words that overlap by
    ``overlap`` words; a text that fits is returned whole."""
    spans = [m.span() for m in re.finditer(r"\S+", text)]
    if len(spans) <= words:
        return [text]
    out: list[str] = []
    step = max(1, words - overlap)
    for start in range(0, len(spans), step):
        end = min(len(spans), start + words)
        out.append(text[spans[start][0] : spans[end - 1][1]])
        if end == len(spans):
            break
    return out


# --------------------------------------------------------------------------- the index


class RecallIndex:
    """Entries of one run, searchable densely (when an embedder is set) and lexically.

    Not thread-safe; a run owns one. ``max_entries`` is the FIFO cap: adding past it
    drops the oldest entries from every index.
    """

    def __init__(
        self,
        embedder: Embedder | None,
        *,
        max_entries: int = 4096,
        fusion: Fusion | None = None,
        passages: bool = True,
        ivf_min: int = IVF_MIN,
    ):
        self.embedder = embedder
        self.passages = passages
        """Whether a long entry's passages get vectors too (off for one-sentence entries,
        such as durable memory's facts, which are stored with one vector each)."""
        self.max_entries = max_entries
        self.fusion = fusion or Fusion()
        self.entries: OrderedDict[int, Entry] = OrderedDict()
        self._next_id = 0
        self._dense: EntryVectors | None = None
        # BM25 on each entry, on the entry with the end of the message before it, and on the
        # entry's neighbourhood; all three are updated entry by entry, never rebuilt
        self._lexical = IncrementalBM25()
        self._lexical_window = IncrementalBM25()
        self._lexical_context = IncrementalBM25()
        self._tokens: dict[int, tuple[list[str], list[str]]] = {}
        self._context_tokens: dict[int, list[str]] = {}
        self.evicted_total = 0
        """How many entries the FIFO cap has dropped."""
        self.exact_max = EXACT_MAX
        """Past this many entries the dense side is scored on candidates (see :data:`EXACT_MAX`)."""
        self.candidates = CANDIDATES
        """Dense and lexical candidates each, on a large index (at least ``k``)."""
        if embedder is not None:
            self._dense = EntryVectors(embedder.dim, ivf_min=ivf_min)

    def __len__(self) -> int:
        return len(self.entries)

    @property
    def dense(self) -> bool:
        """True while dense search is on (an embedder is set and has not failed)."""
        return self._dense is not None

    def disable_dense(self) -> None:
        """Drop the dense side; the index goes on lexical-only."""
        self.embedder = None
        self._dense = None

    def embed(self, drafts: Sequence[Entry]) -> np.ndarray:
        """The vectors of ``drafts`` (what :meth:`add` would compute; safe on another thread):
        one per draft, then one per passage of each long draft, in order."""
        embedder = self.embedder
        if embedder is None:
            raise ValueError("dense search is off: there is no embedder")
        texts = [d.label for d in drafts] + [w for d in drafts for w in self._passages(d)]
        vecs = np.asarray(embedder.embed(texts), dtype=np.float32)
        if vecs.shape != (len(texts), embedder.dim):
            raise ValueError(f"embedder returned shape {vecs.shape}, expected {(len(texts), embedder.dim)}")
        return vecs

    def add(self, drafts: Sequence[Entry], *, vectors: np.ndarray | None = None) -> list[Entry]:
        """Add entries (their ``id`` is assigned here), with their ``vectors`` if they were
        embedded already (:meth:`embed`). Embeds first, so an embedder that raises leaves the
        index unchanged."""
        if not drafts:
            return []
        entries = [replace(d, id=self._next_id + i) for i, d in enumerate(drafts)]
        if self._dense is not None and self.embedder is not None:
            vecs = self.embed(entries) if vectors is None else vectors
            counts = [len(self._passages(e)) for e in entries]
            want = (len(entries) + sum(counts), self.embedder.dim)
            if vecs.shape != want:
                raise ValueError(f"vectors of shape {vecs.shape}, expected {want} (each entry, then its passages)")
            self._dense.add(vecs[: len(entries)], vecs[len(entries) :], counts)
        self._next_id += len(entries)
        for e in entries:
            self.entries[e.id] = e
            label = tokenize(e.label)
            window = tokenize(e.before) + label if e.before else label
            self._tokens[e.id] = (label, window)
            self._lexical.add(e.id, label)
            self._lexical_window.add(e.id, window)
        r = self.fusion.context_radius
        self._enforce_cap()
        self._refresh_context(range(entries[0].id - r, self._next_id))
        return entries

    def _passages(self, entry: Entry) -> list[str]:
        return passages_of(entry.label) if self.passages else []

    def _refresh_context(self, ids: range) -> None:
        """Recompute the neighbourhood document of each entry in ``ids`` (a new or dropped
        neighbour changes it)."""
        if self.fusion.lexical_context <= 0:
            return
        r = self.fusion.context_radius
        for i in ids:
            if i not in self.entries:
                continue
            tokens = [t for j in range(i - r, i + r + 1) if j in self._tokens for t in self._tokens[j][0]]
            old = self._context_tokens.get(i)
            self._context_tokens[i] = tokens
            self._lexical_context.add(i, tokens, old=old)

    def _enforce_cap(self) -> None:
        over = len(self.entries) - self.max_entries
        if over <= 0:
            return
        old = [self.entries.popitem(last=False)[0] for _ in range(over)]
        for i in old:
            label, window = self._tokens.pop(i)
            self._lexical.remove(i, label)
            self._lexical_window.remove(i, window)
            context = self._context_tokens.pop(i, None)
            if context is not None:
                self._lexical_context.remove(i, context)
        self.evicted_total += over
        if self._dense is not None:
            self._dense.drop_oldest(over)
        first = next(iter(self.entries))
        self._refresh_context(range(first, first + self.fusion.context_radius))

    def rarest(self, text: str, n: int) -> list[str]:
        """The ``n`` tokens of ``text`` with the highest IDF among the indexed entries (tokens
        no entry holds are left out: they cannot match)."""
        scored = {t: self._lexical.idf(t) for t in set(tokenize(text))}
        return [t for t, idf in sorted(scored.items(), key=lambda kv: (-kv[1], kv[0])) if idf > 0][:n]

    def dense_size(self) -> int:
        """Entries in the dense index (each with its own vector, and its passages'); 0 when dense is off."""
        return len(self._dense) if self._dense is not None else 0

    def _bm25_signals(self) -> list[tuple[float, IncrementalBM25]]:
        """The BM25 signals this index weighs, with their weights."""
        f = self.fusion
        signals = (
            (f.lexical, self._lexical),
            (f.lexical_window, self._lexical_window),
            (f.lexical_context, self._lexical_context),
        )
        return [(w, lex) for w, lex in signals if w > 0]

    def shared_bm25(self) -> IncrementalBM25:
        """The one BM25 signal this index weighs, which :func:`search_together` puts on one
        scale with other indexes'; ValueError for an index that weighs several or none."""
        weighed = self._bm25_signals()
        if len(weighed) != 1:
            raise ValueError(f"indexes searched together weigh one BM25 signal each (this one weighs {len(weighed)})")
        return weighed[0][1]

    def _lexical_scores(
        self, tokens: list[str], upto: int, shared: SharedScale | None = None
    ) -> tuple[np.ndarray, float, np.ndarray | None]:
        """The weighted sum of the scaled BM25 signals of the first ``upto`` entries (oldest
        first), the sum of their weights, and the raw BM25 of each entry alone (of its window
        when only that is weighed, as durable memory's passages are; None without either). An
        entry any signal matched has a positive sum. Each signal is scaled by its best score;
        with ``shared``, by the term statistics and the best of several indexes (and its raw
        scores, computed there, are not computed again)."""
        n, first = len(self.entries), next(iter(self.entries))
        total = np.zeros(upto, dtype=np.float32)
        weight = 0.0
        raw: np.ndarray | None = None
        for w, lex in self._bm25_signals():
            if shared is not None and id(lex) in shared.raw:
                scores = shared.raw[id(lex)][:upto].copy()
            else:
                scores = lex.scores(tokens, None, n, first=first, stats=shared.stats if shared else None)[:upto]
            if lex is self._lexical or (lex is self._lexical_window and raw is None):
                raw = scores.copy()
            best = max(float(scores.max()) if upto else 0.0, shared.best if shared else 0.0)
            if best > 0:  # scaled so the best is 1, and weighted, in place
                scores *= np.float32(w / best)
                total += scores
            weight += w
        return total, weight, raw

    def _dense_scores(self, q: np.ndarray, upto: int | None = None) -> np.ndarray:
        """The cosine with ``q`` of the first ``upto`` entries (default: all), oldest first,
        scaled so the mean is 0 and the best 1."""
        assert self._dense is not None
        cos = self._dense.scores(q)[: len(self.entries) if upto is None else upto]
        mean, best = float(self._dense.centroid @ q), float(cos.max())
        scaled: np.ndarray = (cos - mean) / (best - mean) if best > mean else np.zeros_like(cos)
        return scaled

    def _dense_candidates(self, q: np.ndarray, lexical: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """On a large index: the entries that can be in the top ``k`` and their fused scores
        (the same entries and scores that scoring every entry gives, until the codes are
        clustered: then a dense candidate may be missed where it lies in a cluster the scan
        did not read).

        Candidates are the best dense entries by their 8-bit codes and the best lexical ones,
        scored exactly. An entry outside both scores at most its lexical score plus the
        dense weight times the scaled cosine of the weakest dense candidate (and the codes'
        margin); every entry that bound lets reach the ``k``-th score is scored exactly too.
        """
        assert self._dense is not None
        wd = self.fusion.dense
        c = max(k, self.candidates)
        dense, weakest_cos = self._dense.top(q, c)
        scanned = len(dense) > 0
        dense = dense[dense < len(lexical)]  # only the first entries (a fork's share of its parent's index)
        # the best lexical entries among those matched (NumPy's selection slows tenfold on
        # an array that is mostly zeros, as a rare term's scores are)
        best_lexical = np.flatnonzero(lexical > 0)
        if len(best_lexical) > c:
            best_lexical = best_lexical[np.argpartition(lexical[best_lexical], len(best_lexical) - c)[-c:]]
        picked = np.union1d(dense, best_lexical).astype(np.int64)
        if not len(picked):  # every dense candidate lies past ``upto`` and nothing matched lexically
            picked = np.arange(len(lexical))
        cos = self._dense.gather(q, picked)
        mean, best = float(self._dense.centroid @ q), float(cos.max())
        span = best - mean if best > mean else 0.0

        def fused(positions: np.ndarray, cosines: np.ndarray) -> np.ndarray:
            scaled = (cosines - mean) / span if span else np.zeros_like(cosines)
            out: np.ndarray = lexical[positions] + wd * scaled
            return out

        scores = fused(picked, cos)
        kth = float(np.partition(scores, len(scores) - k)[len(scores) - k]) if len(scores) >= k else -np.inf
        weakest = weakest_cos + _CODE_MARGIN if scanned else best
        bound = lexical + (wd * (weakest - mean) / span if span else 0.0)
        bound[picked] = -np.inf
        more = np.flatnonzero(bound >= kth)
        if len(more):
            picked = np.concatenate([picked, more])
            scores = np.concatenate([scores, fused(more, self._dense.gather(q, more))])
        return picked, scores

    def nearest(self, vector: np.ndarray, k: int) -> list[tuple[Entry, float]]:
        """The ``k`` entries whose vectors are nearest ``vector`` (a unit vector), with their
        exact cosines, best first (empty without dense search)."""
        if self._dense is None or not self.entries or k < 1:
            return []
        cosines = self._dense.scores(np.ascontiguousarray(vector, dtype=np.float32))
        best = np.argsort(-cosines, kind="stable")[:k]
        first = next(iter(self.entries))
        return [(self.entries[first + int(j)], float(cosines[j])) for j in best]

    def search(
        self, query: str, k: int = 5, *, upto: int | None = None, shared: SharedScale | None = None
    ) -> list[Hit]:
        """The best ``k`` entries for ``query``, best first; with ``upto``, among the first
        ``upto`` entries only (the oldest: a fork reads its parent's index up to the fork
        point, :meth:`count_until`). Every signal is scaled over those entries alone; BM25's
        term statistics are the whole index's (with ``shared``, those of several indexes, and
        their best: :func:`search_together`).

        The score is the weighted sum of the scaled signals (see :class:`Fusion`) over the
        sum of the weights, clipped to [0, 1].
        """
        upto = len(self.entries) if upto is None else min(upto, len(self.entries))
        if not self.entries or upto < 1 or not query.strip() or k < 1:
            return []
        with _one_blas_thread():
            return self._search(query, k, upto, shared)

    def count_until(self, distillation_seq: int) -> int:
        """How many of the oldest entries a distillation at or before ``distillation_seq``
        evicted: entries are added in the order of their distillations, so they are the
        first ones (counted from the newest back: a fork at the end of its parent counts few)."""
        later = 0
        for e in reversed(self.entries.values()):
            if e.distillation_seq <= distillation_seq:
                break
            later += 1
        return len(self.entries) - later

    def _search(self, query: str, k: int, upto: int, shared: SharedScale | None = None) -> list[Hit]:
        f = self.fusion
        embedder = self.embedder if self._dense is not None and f.dense > 0 else None
        q = np.ascontiguousarray(embedder.embed([query]), dtype=np.float32)[0] if embedder is not None else None
        total, weight, raw_bm25 = self._lexical_scores(tokenize(query), upto, shared)
        first = next(iter(self.entries))
        if q is None:
            candidates = np.flatnonzero(total > 0)
            scores = total[candidates]
        else:
            weight += f.dense
            if upto <= self.exact_max:
                candidates = np.arange(upto)
                scores = total + f.dense * self._dense_scores(q, upto)
            else:
                candidates, scores = self._dense_candidates(q, total, k)
        if not len(candidates) or weight == 0:
            return []
        if len(candidates) > k:  # the k best without sorting them all
            best = np.argpartition(-scores, k - 1)[:k]
            candidates, scores = candidates[best], scores[best]
        order = np.argsort(-scores, kind="stable")
        positions = candidates[order].astype(np.int64)
        cosines = self._dense.gather(q, positions) if q is not None and self._dense is not None else None
        return [
            Hit(
                self.entries[first + int(p)],
                round(float(np.clip(scores[j] / weight, 0.0, 1.0)), 6),
                cosine=round(float(cosines[i]), 6) if cosines is not None else None,
                bm25=round(float(raw_bm25[p]), 6) if raw_bm25 is not None else 0.0,
            )
            for i, (j, p) in enumerate(zip(order, positions, strict=True))
        ]


@dataclass(frozen=True)
class SharedScale:
    """BM25 on one scale for indexes searched together (:func:`search_together`)."""

    stats: TermStats
    """Their summed documents, lengths and query terms' document frequencies."""
    raw: dict[int, np.ndarray]
    """Each index's raw scores with those statistics, by its BM25 signal's ``id``."""
    best: float
    """The best of those scores."""


def search_together(indexes: Sequence[RecallIndex], query: str, k: int) -> list[list[Hit]]:
    """The best ``k`` of each of ``indexes`` for ``query``, their BM25 on one scale: weighed
    by the term statistics of all of them together and scaled by the best score in any,
    where each alone would use its own (so the same words score the same in a small index
    and a large one). Hits of different indexes can then be ranked together: the best of
    weak matches in one (a fact that shares one word with the question) is not raised to
    the score of a strong match in another. Each index's cosine stays scaled over its own
    entries, from its own mean (the kinds' vectors differ: a statement, a speaker's line).
    Each index weighs one BM25 signal (:meth:`RecallIndex.shared_bm25`)."""
    tokens = tokenize(query)
    signals = [(index, lex) for index, lex in ((i, i.shared_bm25()) for i in indexes) if index.entries]
    documents, length, df = 0, 0, Counter[str]()
    for _, lex in signals:
        n, total, frequencies = lex.term_stats(tokens)
        documents, length = documents + n, length + total
        df.update(frequencies)
    stats: TermStats = (documents, length, dict(df))
    raw = {
        id(lex): lex.scores(tokens, None, len(index.entries), first=next(iter(index.entries)), stats=stats)
        for index, lex in signals
    }
    scale = SharedScale(stats, raw, max((float(r.max()) for r in raw.values()), default=0.0))
    return [index.search(query, k, shared=scale) for index in indexes]
