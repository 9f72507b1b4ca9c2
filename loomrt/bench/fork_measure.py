"""Fork cost against history length: forking a fold run reads its parent's last catalog
and the messages after it, so it costs the same at 10,000 messages as at 100; a recap run's
fork replays its parent's record, so its cost grows with it (shown beside, for scale).

Each run is a scripted chat played to ``n`` messages on a fresh record; then the run is
forked at its last seq ``forks`` times and each fork timed (median reported; the ratio is
the median at the largest size ÷ at the smallest). The goal (issue 15): fold's ratio ≤ 2.
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


async def _timed_forks(mode: str, messages: int, forks: int) -> float:
    provider = ScriptedProvider(
        turns=[{"text": f"Noted update {i}."} for i in range(messages // 2 + 1)],
        summaries=[{"extractive": 600, "words": 16}],
    )
    rt = Runtime(SQLiteStore(":memory:"), providers=lambda s, m: provider)
    spec = AgentSpec(
        model="scripted/fork-cost",
        context={"mode": mode, "budget_tokens": 8192, "keep_last_n": 6, "fold": {"max_calls_per_10min": 10**6}},
    )
    run = await rt.astart(spec, interactive=True)
    for i in range(messages // 2):
        await rt.send(run, _said(i))
    times = []
    for _ in range(forks):
        started = time.perf_counter()
        await rt.fork(run.run_id)
        times.append(time.perf_counter() - started)
    return statistics.median(times) * 1000


def fork_cost_figures(
    sizes: tuple[int, ...] = (100, 10_000), forks: int = 15, progress: Progress | None = None
) -> dict[str, Any]:
    rows = []
    for mode in ("fold", "recap"):
        ms = {}
        for n in sizes:
            if progress:
                progress.note(f"fork_cost · {mode} · {n} messages")
            ms[n] = asyncio.run(_timed_forks(mode, n, forks))
            if progress:
                progress.advance()
        rows.append(
            {
                "mode": mode,
                **{f"ms_at_{n}": round(v, 3) for n, v in ms.items()},
                "ratio": round(ms[sizes[-1]] / ms[sizes[0]], 2),
            }
        )
    return {"sizes": list(sizes), "forks": forks, "rows": rows, "goal": "fold: ratio ≤ 2"}


@standalone_measure(
    "fork_cost", "forking a fold run at 100 and 10,000 messages (median ms; recap's replaying fork beside it)"
)
def fork_cost(config: BenchConfig, progress: Progress) -> dict[str, Any]:
    sizes = (100, 1000) if config.quick else (100, 10_000)
    progress.start("fork_cost", 2 * len(sizes))
    return fork_cost_figures(sizes, 7 if config.quick else 15, progress)
