"""Fork cost against history length: forking a fold run reads its parent's last catalog
and the messages after it, so it costs the same at 10,000 messages as at 100; a recap run's
fork replays its parent's record, so its cost grows with it (shown beside, for scale).

Each run is a scripted chat played to ``n`` messages on a fresh record; then the run is
forked at its last seq ``forks`` times and each fork timed (median reported; the ratio is
the median at the largest size ÷ at the smallest). The goal (issue 15): fold's ratio ≤ 2.

``fold + recall`` is the same with recall on: the fork reads its parent's recall index,
filtered at the fork point, instead of re-reading and re-indexing the shared history
(:mod:`loomrt.recall.shared`); its first Recall is timed too. The goal (issue 38): ratio ≤ 2
and the first Recall ≤ 50 ms at the largest size. ``rebuilt`` beside it is the fork that
finds no index to read (another process): the cost the sharing saves.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from typing import Any

from loomrt.bench.core import BenchConfig, Progress, standalone_measure
from loomrt.record.sqlite import SQLiteStore
from loomrt.runtime import Runtime
from loomrt.spec import AgentSpec
from loomrt.testing import ScriptedProvider

__all__ = ["fork_cost", "fork_cost_figures"]


def _said(i: int) -> str:
    return (
        f"Update {i}: the item {i % 97} of the checklist moved to stage {i % 5}; the reviewer for it is "
        f"person {i % 13}, and the reference is REF-{1000 + i}."
    )


async def _timed_forks(
    mode: str, messages: int, forks: int, *, recall: bool = False, shared: bool = True, embedder: Any = None
) -> tuple[float, float | None, int]:
    """The median ms of a fork at the end of a ``messages``-long run, and with ``recall`` the
    median ms of each fork's first Recall and the most entries a fork indexed itself
    (``shared``: the fork may read its parent's index)."""
    from loomrt.recall.shared import forget

    provider = ScriptedProvider(
        turns=[{"text": f"Noted update {i}."} for i in range(messages // 2 + 1)],
        summaries=[{"extractive": 600, "words": 16}],
    )
    rt = Runtime(SQLiteStore(":memory:"), providers=lambda s, m: provider, embedder=embedder)
    context: dict[str, Any] = {
        "mode": mode,
        "budget_tokens": 8192,
        "keep_last_n": 6,
        "fold": {"max_calls_per_10min": 10**6},
    }
    if recall:  # a smaller budget, so that even the shortest run has evicted something to recall
        context.update(budget_tokens=2048, recall=True, recall_inject="off", recall_max_entries=max(4096, messages))
    run = await rt.astart(AgentSpec(model="scripted/fork-cost", context=context), interactive=True)
    for i in range(messages // 2):
        await rt.send(run, _said(i))
    if recall:
        run.toolset.recall.size()  # the parent's own index is whole before any fork is timed
    times, first_recall, indexed = [], [], 0
    if not shared:  # each such fork re-embeds the whole shared history: a few show the cost
        forks = min(forks, 3)
    for i in range(forks):
        if not shared:
            forget()
        started = time.perf_counter()
        fork = await rt.fork(run.run_id)
        times.append(time.perf_counter() - started)
        if recall:
            started = time.perf_counter()
            hits = fork.toolset.recall.search(f"reviewer for REF-{1000 + (i * 37) % (messages // 2)}", top_k=5)
            first_recall.append(time.perf_counter() - started)
            if not hits:
                raise RuntimeError("the fork's Recall found nothing of its shared history")
            indexed = max(indexed, len(fork.toolset.recall.index))
    rt.store.close()
    return statistics.median(times) * 1000, statistics.median(first_recall) * 1000 if first_recall else None, indexed


VARIANTS: dict[str, dict[str, Any]] = {
    "fold": {"mode": "fold"},
    "recap": {"mode": "recap"},
    "fold + recall": {"mode": "fold", "recall": True},
    "fold + recall, rebuilt": {"mode": "fold", "recall": True, "shared": False},
}
"""Each row: the run's mode, and whether recall is on and the fork may read its parent's index."""


def fork_cost_figures(
    sizes: tuple[int, ...] = (100, 10_000),
    forks: int = 15,
    progress: Progress | None = None,
    *,
    variants: tuple[str, ...] = tuple(VARIANTS),
    embedder: Any = None,
) -> dict[str, Any]:
    rows = []
    for name in variants:
        ms, first, indexed = {}, {}, {}
        for n in sizes:
            if progress:
                progress.note(f"fork_cost · {name} · {n} messages")
            ms[n], first[n], indexed[n] = asyncio.run(
                _timed_forks(messages=n, forks=forks, embedder=embedder, **VARIANTS[name])
            )
            if progress:
                progress.advance()
        row: dict[str, Any] = {
            "mode": name if VARIANTS[name].get("shared", True) else f"{name} (median of {min(forks, 3)})",
            **{f"ms_at_{n}": round(v, 3) for n, v in ms.items()},
            "ratio": round(ms[sizes[-1]] / ms[sizes[0]], 2),
        }
        if first[sizes[-1]] is not None:
            row.update({f"first_recall_ms_at_{n}": round(v or 0.0, 3) for n, v in first.items()})
            row["fork_indexed_at_largest"] = indexed[sizes[-1]]  # entries the fork indexed itself
        rows.append(row)
    return {
        "sizes": list(sizes),
        "forks": forks,
        "rows": rows,
        "goal": "fold and fold + recall: ratio ≤ 2; fold + recall: the first Recall ≤ 50 ms",
    }


@standalone_measure(
    "fork_cost", "forking a fold run at 100 and 10,000 messages (median ms; recap's replaying fork beside it)"
)
def fork_cost(config: BenchConfig, progress: Progress) -> dict[str, Any]:
    sizes = (100, 1000) if config.quick else (100, 10_000)
    progress.start("fork_cost", len(VARIANTS) * len(sizes))
    return fork_cost_figures(sizes, 7 if config.quick else 15, progress, embedder=config.make_embedder())
