"""Recall: search over a run's evicted spans (and durable memory), returning the originals.

Every evicted message is indexed by the run's :class:`RunRecall` (dense MiniLM vectors in
faiss, and BM25), and the ``Recall(query, top_k=5)`` tool returns the original words
verbatim with their source, score, record seq and timestamp. See ``docs/recall.md``.

Heavy parts (torch, sentence-transformers, faiss) load on first use.
"""

from __future__ import annotations

from loomrt.recall.embedders import (
    NO_EMBEDDER,
    CachedEmbedder,
    Embedder,
    HashEmbedder,
    MiniLMEmbedder,
    resolve_embedder,
)
from loomrt.recall.memory import MemoryHit, MemorySource
from loomrt.recall.run_recall import RunRecall
from loomrt.recall.tool import RECALL_PROMPT, RecallHit

__all__ = [
    "RunRecall",
    "RECALL_PROMPT",
    "RecallHit",
    "Embedder",
    "MiniLMEmbedder",
    "HashEmbedder",
    "CachedEmbedder",
    "NO_EMBEDDER",
    "resolve_embedder",
    "MemorySource",
    "MemoryHit",
]
