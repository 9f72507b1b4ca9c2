"""The ``concurrency`` measure: 100 scripted runs at once in one process, on the async core.

Each run is an interactive recap chat on a small budget (so boundaries happen) whose model
answers after a short asynchronous wait (a network model's latency, 2 ms here). All runs are
played concurrently with ``asyncio.gather``; per turn, the runtime's own time is the turn's
wall time less the time its model call spent waiting. Reported: whether every run finished,
the p50/p99 of that overhead and their ratio (the reliability issue asks for p99 ≤ 3× p50),
apart for the turns without a boundary (a distillation is that turn's own work, not
another run blocking it), and the total wall time against the sum of the model waits (how
much the runs overlapped).
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from pathlib import Path
from typing import Any

from loomrt.bench.core import BenchConfig, Progress, standalone_measure

__all__ = ["concurrency", "play_concurrently"]


async def play_concurrently(runs: int, turns: int, *, latency_s: float, db: Path) -> dict[str, Any]:
    """Play ``runs`` chats of ``turns`` turns at once; the figures of :func:`concurrency`."""
    from loomrt.providers.base import ModelRequest, ModelResponse
    from loomrt.providers.scripted import extractive_summary
    from loomrt.record.sqlite import SQLiteStore
    from loomrt.runtime import Runtime
    from loomrt.spec import AgentSpec
    from loomrt.testing import FunctionProvider

    waited: dict[int, float] = {}

    async def answer(request: ModelRequest) -> ModelResponse:
        started = time.perf_counter()
        await asyncio.sleep(latency_s)
        key = id(asyncio.current_task())
        waited[key] = waited.get(key, 0.0) + time.perf_counter() - started
        if request.purpose != "turn":
            return ModelResponse(text=extractive_summary(request, max_chars=400, words_per_line=10))
        return ModelResponse(text="Noted; I will keep that in mind for later.")

    provider = FunctionProvider(answer, name="bench/latency")
    runtime = Runtime(SQLiteStore(db), providers=lambda s, m: provider, embedder="hash")
    spec = AgentSpec(
        model="bench/latency",
        system_prompt="You keep track of what the user says.",
        context={"mode": "recap", "budget_tokens": 600, "keep_last_n": 2, "recall": True},
    )
    overheads: list[float] = []
    plain: list[float] = []  # turns without a boundary (a distillation is that turn's own work)

    async def one(i: int) -> bool:
        run = await runtime.astart(spec, interactive=True, name=f"load-{i}")
        key = id(asyncio.current_task())
        distilled = 0
        for t in range(turns):
            waited[key] = 0.0
            started = time.perf_counter()
            result = await runtime.send(
                run,
                f"Run {i}, turn {t}: the garden needs another look, and the budget "
                f"for the fair is settled at {100 + t} euros; keep it in mind.",
            )
            spent = (time.perf_counter() - started - waited[key]) * 1000
            overheads.append(spent)
            if result.distillations == distilled:
                plain.append(spent)
            distilled = result.distillations
            if result.status == "failed":
                return False
        return True

    await one(-1)  # warm-up: the tokenizer, the embedder and the first index are loaded once, not measured
    overheads.clear()
    plain.clear()
    started = time.perf_counter()
    done = await asyncio.gather(*(one(i) for i in range(runs)))
    wall = time.perf_counter() - started
    runtime.store.close()
    p50, p99 = _p(overheads, 0.5), _p(overheads, 0.99)
    return {
        "runs": runs,
        "turns_per_run": turns,
        "finished": sum(done),
        "model_latency_ms": latency_s * 1000,
        "p50_ms": round(p50, 3),
        "p99_ms": round(p99, 3),
        "p99_over_p50": round(p99 / p50, 2) if p50 else None,
        "turns_without_boundary": len(plain),
        "plain_p50_ms": round(_p(plain, 0.5), 3),
        "plain_p99_ms": round(_p(plain, 0.99), 3),
        "wall_s": round(wall, 2),
        "serial_model_wait_s": round(runs * turns * latency_s, 2),
    }


def _p(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else 0.0


@standalone_measure("concurrency", "100 scripted runs at once in one process: all finish; p99 vs p50 turn overhead")
def concurrency(config: BenchConfig, progress: Progress) -> dict[str, Any]:
    runs, turns = (20, 5) if config.quick else (100, 20)
    progress.start("concurrency", 1)
    with tempfile.TemporaryDirectory() as tmp:
        out = asyncio.run(play_concurrently(runs, turns, latency_s=0.002, db=Path(tmp) / "load.db"))
    progress.advance()
    return out
