"""What the clustered scan costs in results: Recall's top 5 with the inverted file against
every entry scored exactly, on entries embedded by the real embedder.

Past :data:`~loomrt.recall.dense.IVF_MIN` vectors the dense candidates come from the
nearest quarter of the clusters only, so a hit in a cluster the scan did not read is
lost. ``recall_scale`` cannot see that: its entries have cheap vectors, which cluster
like noise. Here every entry is a MiniLM vector (24,000 of them, the file trained from
8,192 on: the same code past 32,768), and each query is searched twice, as the index
does it and with every entry scored (``exact_max`` past the size). The figure can say no:
a lost hit shows as a top 5 that differs.
"""

from __future__ import annotations

import random
import time
from typing import Any

from loomrt.bench.core import BenchConfig, Progress, standalone_measure
from loomrt.recall.embedders import EmbedderChoice

__all__ = ["clustered_agreement", "recall_clusters"]


def clustered_agreement(
    entries: int = 24_000,
    *,
    ivf_min: int = 8_192,
    embedder: EmbedderChoice = None,
    seed: int = 11,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """Agreement of the clustered search with the exact one over needle and filler queries:
    ``same_top5`` (the share of queries whose five hits are the same entries),
    ``top5_overlap`` (the mean share of the exact five found), ``same_top1``, and
    ``dense_top5_in_candidates`` (the share of the exact dense top 5 among the scan's
    candidates)."""
    import numpy as np

    from loomrt.bench.recall_targets import _TOPICS, _VERBS, agentic_filler, make_needles
    from loomrt.recall.embedders import resolve_embedder
    from loomrt.recall.index import Entry, RecallIndex

    resolved = resolve_embedder(embedder)
    if resolved is None:
        return {"skipped": "no embedder (the measure needs real vectors)"}
    rng = random.Random(seed)
    needles = make_needles(seed)
    index = RecallIndex(resolved, max_entries=entries, ivf_min=ivf_min)
    started = time.perf_counter()
    batch = 512
    for start in range(0, entries, batch):
        drafts = []
        for i in range(start, min(entries, start + batch)):
            text = needles[i % len(needles)].statement if i % 997 == 500 else agentic_filler(rng, i)
            drafts.append(Entry(id=-1, run_id="bench", seq=i + 1, distillation_seq=entries + 1, role="user", text=text))
        index.add(drafts)
        if progress is not None:
            progress.advance()
    build_s = time.perf_counter() - started
    assert index._dense is not None
    queries = (
        [n.query for n in needles]
        + [f"{rng.choice(_VERBS)} the {rng.choice(_TOPICS)} service on node-{rng.randint(1, 40)}" for _ in range(24)]
        + [f"which build failed with exit code {rng.choice([1, 2, 137])} on {rng.choice(_TOPICS)}" for _ in range(24)]
    )
    pruned_max = index.exact_max
    same5 = same1 = 0
    overlap = dense_found = 0.0
    for query in queries:
        clustered = [h.entry.id for h in index.search(query, 5)]
        index.exact_max = 10**9
        try:
            exact = [h.entry.id for h in index.search(query, 5)]
        finally:
            index.exact_max = pruned_max
        same5 += set(clustered) == set(exact)
        same1 += bool(clustered and exact and clustered[0] == exact[0])
        overlap += len(set(clustered) & set(exact)) / max(1, len(exact))
        q = np.ascontiguousarray(resolved.embed([query]), dtype=np.float32)[0]
        best = set(np.argsort(-index._dense.scores(q))[:5].tolist())
        found, _ = index._dense.top(q, index.candidates)
        dense_found += len(best & set(found.tolist())) / 5
    n = len(queries)
    return {
        "entries": len(index),
        "ivf_min": ivf_min,
        "clustered": index._dense.whole.clustered,
        "clusters": int(index._dense.whole._codes.nlist) if index._dense.whole.clustered else 0,
        "queries": n,
        "same_top5": round(same5 / n, 3),
        "same_top1": round(same1 / n, 3),
        "top5_overlap": round(overlap / n, 3),
        "dense_top5_in_candidates": round(dense_found / n, 3),
        "build_s": round(build_s, 1),
    }


@standalone_measure(
    "recall_clusters", "Recall's top 5 with the clustered scan against every entry scored, on real MiniLM vectors"
)
def recall_clusters(config: BenchConfig, progress: Progress) -> dict[str, Any]:
    if config.embedder in ("none", "hash"):
        return {"skipped": f"the measure needs the real embedder (embedder: {config.embedder})"}
    entries, ivf_min = (4_096, 1_024) if config.quick else (24_000, 8_192)
    progress.start("recall clusters", (entries + 511) // 512)
    try:
        return clustered_agreement(entries, ivf_min=ivf_min, embedder=config.make_embedder(), progress=progress)
    except ImportError as exc:
        return {"skipped": f"the recall extra is not installed ({exc})"}
