"""The measures: figures per mode (tokens, cache-adjusted cost, fidelity) and standalone ones
(runtime overhead, Recall latency, local-model overhead)."""

from __future__ import annotations

import asyncio
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from loomrt.bench.core import REFERENCE_RATIOS, BenchConfig, ModeRun, Progress, mode_measure, standalone_measure
from loomrt.providers.base import ModelRequest, ModelResponse
from loomrt.record.sqlite import SQLiteStore
from loomrt.runtime import Runtime
from loomrt.spec import AgentSpec
from loomrt.testing import FunctionProvider

__all__ = [
    "tokens",
    "time_model_calls",
    "folding",
    "cache",
    "prompt",
    "fidelity",
    "overhead",
    "recall_latency_measure",
    "recall_scale",
    "recall_needles",
    "local_overhead",
]


def _ratio(a: float, b: float) -> float | None:
    return round(a / b, 4) if b else None


@mode_measure("tokens", "total input tokens (distillation calls included) and the ratio to append")
def tokens(run: ModeRun, base: ModeRun | None, config: BenchConfig) -> dict[str, Any]:
    total = sum(c["input_tokens"] for c in run.calls)
    distil = sum(c["input_tokens"] for c in run.calls if c["purpose"] != "turn")
    turn_prompts = [c["input_tokens"] for c in run.calls if c["purpose"] == "turn"]
    out = {
        "input_tokens": total,
        "distillation_input_tokens": distil,
        "output_tokens": sum(c["output_tokens"] for c in run.calls),
        "model_calls": len(run.calls),
        "distillation_calls": sum(c["purpose"] != "turn" for c in run.calls),
        "distillations": run.distillations,
        "declined": run.declined,
        "peak_prompt_tokens": max(turn_prompts, default=0),
        "ratio": _ratio(total, sum(c["input_tokens"] for c in base.calls)) if base else None,
    }
    if run.resolved in REFERENCE_RATIOS:
        out["reference_ratio"] = REFERENCE_RATIOS[run.resolved]
    return out


@mode_measure(
    "folding",
    "folded size (the final working context's tokens ÷ the history's); fold: cards, "
    "fallback cards, depth, and the verbatim check (values checked and invented, cards rejected)",
)
def folding(run: ModeRun, base: ModeRun | None, config: BenchConfig) -> dict[str, Any]:
    return dict(run.figures)


@mode_measure("cache", "input cost with the cached prefix of each prompt priced at the discount")
def cache(run: ModeRun, base: ModeRun | None, config: BenchConfig) -> dict[str, Any]:
    def cost(r: ModeRun) -> float:
        return float(sum(c["input_tokens"] - c["cached_prefix_tokens"] * (1 - config.cache_discount) for c in r.calls))

    cached = sum(c["cached_prefix_tokens"] for c in run.calls)
    total = sum(c["input_tokens"] for c in run.calls)
    return {
        "cached_tokens": cached,
        "cached_share": _ratio(cached, total),
        "cache_cost": round(cost(run)),
        "cache_ratio": _ratio(cost(run), cost(base)) if base else None,
    }


@mode_measure(
    "prompt",
    "what a turn's prompt holds, in mean estimated tokens per turn call: the head (system "
    "prompt, pinned task, pins), the tool schemas, what distillations wrote (recaps, summaries, cards, Σ) "
    "and the record's raw messages",
)
def prompt(run: ModeRun, base: ModeRun | None, config: BenchConfig) -> dict[str, Any]:
    parts = [c["parts"] for c in run.calls if c.get("parts")]
    if not parts:
        return {}
    return {
        "prompt_parts": {k: round(sum(p[k] for p in parts) / len(parts)) for k in parts[0]},
        "turn_calls": sum(c["purpose"] == "turn" for c in run.calls),
    }


@mode_measure(
    "fidelity",
    "questions the model answered right from what it saw (answered), and planted values still "
    "retrievable at the end: in the working context, or via Recall top 5, not from its own answers",
)
def fidelity(run: ModeRun, base: ModeRun | None, config: BenchConfig) -> dict[str, Any]:
    n = len(run.found)
    ctx, rec = run.found.count("context"), run.found.count("recall")
    recalls = sum(1 for c in run.calls if c["purpose"] == "turn" and c.get("recall_call"))
    out: dict[str, Any] = {
        "answered": _ratio(sum(run.answered), len(run.answered)) if run.answered else None,
        "questions": len(run.answered),
        "recall_calls": recalls,
        "probes": n,
        "in_context": ctx,
        "via_recall": rec,
        "lost": n - ctx - rec,
        "retrievable": _ratio(ctx + rec, n) if n else None,
    }
    return out


# ---------------------------------------------------------------------- overhead


async def _history(runtime: Runtime, spec: AgentSpec, size: int) -> Any:
    """An append-mode run whose working context and record hold ``size`` messages."""
    run = await runtime.astart(spec, name="overhead", interactive=True)
    line = "A message of ordinary length that stands for one turn of a long conversation, number {i}."
    while len(run.context) < size:
        role = "user" if len(run.context) % 2 else "assistant"
        content = line.format(i=len(run.context))
        if role == "user":
            await run.add("user_input", {"content": content})
        else:
            await run.add("assistant_message", {"message": {"role": role, "content": content}})
    return run


def time_model_calls(provider: FunctionProvider) -> dict[str, float]:
    """Wrap ``provider`` so the seconds its calls take add up in the returned ``{"model": s}``
    (a measure of the runtime's own time subtracts them)."""
    spent = {"model": 0.0}
    inner = provider.complete

    async def timed(request: ModelRequest) -> ModelResponse:
        t = time.perf_counter()
        out = await inner(request)
        spent["model"] += time.perf_counter() - t
        return out

    provider.complete = timed  # type: ignore[method-assign]
    return spent


async def _turn_times(db: Path, size: int, repeats: int, progress: Progress) -> list[float]:
    """Milliseconds the runtime itself spends on each of ``repeats`` turns at ``size`` messages."""

    def instant(request: ModelRequest) -> ModelResponse:
        return ModelResponse(text="ok", model="bench/instant")

    provider = FunctionProvider(instant, context_window=10**9, name="bench/instant")
    spent = time_model_calls(provider)

    runtime = Runtime(SQLiteStore(db), providers=lambda s, m: provider)
    spec = AgentSpec(
        model="bench/instant", system_prompt="You answer briefly.", context={"mode": "append", "budget_tokens": 10**9}
    )
    run = await _history(runtime, spec, size)
    await runtime.send(run, "warm-up")  # counts every message once (cached from then on)
    times = []
    for i in range(repeats):
        spent["model"] = 0.0
        t = time.perf_counter()
        await runtime.send(run, f"turn {i}: what next?")
        times.append((time.perf_counter() - t - spent["model"]) * 1000)
        progress.advance()
    runtime.store.close()
    return times


@standalone_measure("overhead", "the runtime's own time per turn (no model, no embedding) against history length")
def overhead(config: BenchConfig, progress: Progress) -> dict[str, Any]:
    """Median and p95 milliseconds per turn, spent by the runtime itself (context building,
    token estimation, record append), with an instant model, at each history length."""
    sizes = [min(s, 1000) for s in config.overhead_sizes] if config.quick else list(config.overhead_sizes)
    sizes = sorted(set(sizes))
    repeats = 5 if config.quick else 20
    progress.start("overhead", len(sizes) * repeats)
    points = []
    with tempfile.TemporaryDirectory() as tmp:
        for size in sizes:
            times = sorted(asyncio.run(_turn_times(Path(tmp) / f"overhead-{size}.db", size, repeats, progress)))
            points.append(
                {
                    "messages": size,
                    "p50_ms": round(statistics.median(times), 3),
                    "p95_ms": round(times[min(len(times) - 1, int(0.95 * len(times)))], 3),
                }
            )
    return {"points": points, "repeats": repeats}


@standalone_measure("recall_latency", "Recall p50/p95 on a 4,096-entry index, query embedding included")
def recall_latency_measure(config: BenchConfig, progress: Progress) -> dict[str, Any]:
    try:
        from loomrt.bench.recall_targets import recall_latency
    except ImportError as exc:
        return {"skipped": f"loomrt.bench.recall_targets is not available ({exc})"}
    entries, queries = (1024, 50) if config.quick else (4096, 200)
    progress.start("recall latency", 1)
    out = dict(recall_latency(entries=entries, queries=queries, embedder=config.make_embedder()))
    progress.advance()
    return {"entries": entries, "queries": queries, **out}


@standalone_measure("recall_scale", "Recall p50/p95 on a 100,000-entry index, the query embedded by the real embedder")
def recall_scale(config: BenchConfig, progress: Progress) -> dict[str, Any]:
    """The entries get cheap vectors (:class:`~loomrt.bench.recall_targets.QueryEmbedder`: the
    scan reads a quarter of the clusters, and cheap vectors fill them about evenly; what the
    clusters cost in results is ``recall_clusters``'); each query is embedded by the real one."""
    try:
        from loomrt.bench.recall_targets import QueryEmbedder, recall_latency
    except ImportError as exc:
        return {"skipped": f"loomrt.bench.recall_targets is not available ({exc})"}
    entries, queries = (20_000, 30) if config.quick else (100_000, 200)
    embedder = QueryEmbedder("hash" if config.embedder == "hash" else None) if config.embedder != "none" else False
    progress.start("recall at scale", 1)
    out = dict(recall_latency(entries=entries, queries=queries, embedder=embedder))
    progress.advance()
    return {"entries": entries, "queries": queries, **out}


@standalone_measure(
    "recall_needles", "exact values stated early in a scripted agentic run, found by Recall in its top 5"
)
def recall_needles(config: BenchConfig, progress: Progress) -> dict[str, Any]:
    try:
        from loomrt.bench.recall_targets import needles_run
    except ImportError as exc:
        return {"skipped": f"loomrt.bench.recall_targets is not available ({exc})"}
    progress.start("recall needles", 1)
    out = dict(needles_run(turns=60 if config.quick else 200, embedder=config.make_embedder(), seed=config.seed))
    progress.advance()
    return out


@standalone_measure("local_overhead", "runtime overhead over bare llama-cpp-python on the embedded local model")
def local_overhead(config: BenchConfig, progress: Progress) -> dict[str, Any]:
    try:
        import llama_cpp  # noqa: F401
    except ImportError:
        return {"skipped": "llama-cpp-python is not installed (pip install 'loomrt[local]')"}
    try:
        from loomrt.bench.overhead_local import measure_local_overhead
    except ImportError as exc:
        return {"skipped": f"loomrt.bench.overhead_local is not available ({exc})"}
    model = config.model if config.model and config.model.startswith("local/") else "local/smollm2-135m"
    progress.start(f"local overhead · {model}", 1)
    out = dict(measure_local_overhead(model=model, repeats=2 if config.quick else 5))
    progress.advance()
    return out
