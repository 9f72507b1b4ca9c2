"""``recall_inject``: what recall injection costs a model call, measured as a run meets it.

An interactive compaction run with recall on holds ``entries`` evicted messages in its index
(handed to the run's own evicted-span callback, as a distillation hands them). Then, inside
the running event loop, each of ``queries`` turns records a user input and runs the
injection step (:func:`loomrt.run.inject.inject_recall`: the query embedding, the search,
the choice, the ``recall_injected`` event). Beside it, the runtime's own time per turn
without a model (the ``overhead`` measure's method) at the same history, so the step's share
of a turn's overhead is one division.
"""

from __future__ import annotations

import asyncio
import random
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from loomrt.bench.core import BenchConfig, Progress, standalone_measure
from loomrt.bench.measures import time_model_calls
from loomrt.bench.recall_targets import agentic_filler, make_needles
from loomrt.messages import EvictedSpan, Message
from loomrt.providers.base import ModelResponse
from loomrt.recall.embedders import EmbedderChoice
from loomrt.record.sqlite import SQLiteStore
from loomrt.runtime import Runtime
from loomrt.spec import AgentSpec
from loomrt.testing import FunctionProvider

__all__ = ["inject_cost", "recall_inject"]


def _p95(xs: list[float]) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(0.95 * len(xs)))]


async def _inject_cost(
    db: Path, entries: int, queries: int, embedder: EmbedderChoice, progress: Progress
) -> dict[str, Any]:
    from loomrt.run.inject import inject_recall

    provider = FunctionProvider(lambda r: ModelResponse(text="ok", model="bench/instant"), name="bench/instant")
    runtime = Runtime(SQLiteStore(db), providers=lambda s, m: provider, embedder=embedder)
    spec = AgentSpec(
        model="bench/instant",
        system_prompt="You answer briefly.",
        context={
            "mode": "compaction",
            "budget_tokens": 8192,
            "recall": True,
            "recall_max_entries": max(entries, 16),
            "recall_inject": "on",
        },
    )
    run = await runtime.astart(spec, name="inject-cost", interactive=True)
    recall = run.toolset.recall
    assert recall is not None
    rng, needles = random.Random(3), make_needles(3)
    progress.start("recall injection: indexing", entries)
    seq = 1
    while recall.size() < entries:
        batch = []
        for _ in range(min(256, entries - recall.size())):
            text = needles[seq % len(needles)].statement if seq % 97 == 0 else agentic_filler(rng, seq)
            batch.append(Message(role="user", content=text, seq=seq, ts=time.time()))
            seq += 1
        recall.on_evicted(EvictedSpan(run.run_id, "bench", "compaction", seq, tuple(batch)))
        recall.size()  # index it now: the measure is the query, not the backlog
        progress.advance(len(batch))
    asks = [f"What was {n.query}?" for n in needles] + [
        f"Which {rng.choice(['service', 'host', 'job'])} failed in the {rng.choice(['nightly', 'morning'])} run?"
        for _ in range(10)
    ]
    progress.start("recall injection: queries", queries)
    # the process's first injection loads what every later one reuses (the token counter's
    # tables, the BLAS thread pool): reported apart, as a start-up cost, not a per-call one
    await run.add("user_input", {"content": asks[-1]})
    t = time.perf_counter()
    await inject_recall(run)
    first = (time.perf_counter() - t) * 1000
    step, injected = [], 0
    for i in range(queries):
        await run.add("user_input", {"content": asks[i % len(asks)]})
        t = time.perf_counter()
        block = await inject_recall(run)
        step.append((time.perf_counter() - t) * 1000)
        injected += block is not None
        progress.advance()
    spent = time_model_calls(provider)
    turns = []
    for i in range(max(5, queries // 4)):
        spent["model"] = 0.0
        t = time.perf_counter()
        await runtime.send(run, asks[i % len(asks)])
        turns.append((time.perf_counter() - t - spent["model"]) * 1000)
    runtime.store.close()
    p50 = statistics.median(step)
    turn = statistics.median(turns)
    return {
        "entries": recall.size(),
        "queries": queries,
        "dense": recall.index.dense,
        "step_p50_ms": round(p50, 2),
        "step_p95_ms": round(_p95(step), 2),
        "first_step_ms": round(first, 2),
        "injected_share": round(injected / queries, 3),
        "turn_overhead_p50_ms": round(turn, 2),
        "step_share_of_turn": round(p50 / turn, 3) if turn else None,
    }


def inject_cost(
    entries: int, queries: int, *, embedder: EmbedderChoice = None, progress: Progress | None = None
) -> dict[str, Any]:
    """The injection step's p50/p95 (ms) at ``entries`` index entries, and its share of a turn."""
    from loomrt.bench.core import NullProgress

    with tempfile.TemporaryDirectory() as folder:
        return asyncio.run(
            _inject_cost(Path(folder) / "inject.db", entries, queries, embedder, progress or NullProgress())
        )


@standalone_measure(
    "recall_inject", "recall injection's step (query embedding, search, choice, event) per model call at 10,000 entries"
)
def recall_inject(config: BenchConfig, progress: Progress) -> dict[str, Any]:
    entries, queries = (1000, 30) if config.quick else (10_000, 200)
    return inject_cost(entries, queries, embedder=config.make_embedder(), progress=progress)
