"""The ``harvest_speed`` measure: how fast the embedded model consolidates banked spans.

The first sessions of a LoCoMo conversation (``--data``; the first conversation unless
``--conversation``) are banked, one span a session, and drained by the consolidator with the
embedded model. Reported: spans a minute, seconds a fact, the model's calls, the tokens it
read and wrote, the seconds in its calls, and the statements the checks dropped (by reason),
so where the time goes can be read: the model's prefill and decode, the consolidator's own
work, or replies written and then thrown away. The goal counts only where facts were written. Issue 48's goal: at least
4× the 0.66 spans a minute measured on the whole development split before. Run only when
named (`loomrt bench run harvest_speed --data FILE`).
"""

from __future__ import annotations

import asyncio
import contextlib
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from loomrt.bench.core import BenchConfig, Progress, standalone_measure

__all__ = ["BEFORE_SPANS_PER_MIN", "SESSIONS", "consolidated", "counted_calls", "harvest_speed"]

BEFORE_SPANS_PER_MIN = 0.66
"""Spans a minute on LoCoMo's development split, consolidated by the embedded model, when
issue 48 was filed; the goal is 4× this."""
SESSIONS = 6
"""Sessions banked (``--quick``: 2)."""


@contextlib.contextmanager
def counted_calls() -> Iterator[dict[str, float]]:
    """Inside: every llama.cpp completion counted (calls, tokens read and written, seconds)."""
    import llama_cpp

    llama: Any = llama_cpp.Llama
    counts = {"calls": 0, "prompt_tokens": 0, "completion_tokens": 0, "seconds": 0.0}
    real = llama.create_completion

    def counting(self: Any, *args: Any, **kw: Any) -> Any:
        started = time.perf_counter()
        out = real(self, *args, **kw)
        counts["seconds"] += time.perf_counter() - started
        counts["calls"] += 1
        counts["prompt_tokens"] += out["usage"]["prompt_tokens"]
        counts["completion_tokens"] += out["usage"]["completion_tokens"]
        return out

    llama.create_completion = counting
    try:
        yield counts
    finally:
        llama.create_completion = real


async def consolidated(tmp: Path, sample: dict[str, Any], cid: str, sessions: int, model: str) -> dict[str, Any]:
    """Bank the first ``sessions`` of ``sample`` in a store of its own and drain them with
    ``model``: the seconds, the spans, the facts written and the model's counts."""
    from loomrt.bench.harvest_bench import bank_sessions, drained
    from loomrt.harvest.consolidator import Consolidator, _default_provider
    from loomrt.harvest.db import harvest_db
    from loomrt.harvest.memory import MemoryStore
    from loomrt.record.sqlite import SQLiteStore

    store = SQLiteStore(tmp / "record.sqlite")
    db = harvest_db(store.path)
    memory = MemoryStore(db, embedder="hash")
    scope = f"user:{cid}"
    by_session, _ = bank_sessions(db, cid, sample, scope, sessions=sessions)
    worker = Consolidator(store, provider=_default_provider(model), memory=memory, db=db, settle_s=0)
    with counted_calls() as counts:
        started = time.perf_counter()
        report = await drained(worker)
        seconds = time.perf_counter() - started
    facts = sorted(f.statement for f in memory.facts([scope]))
    return {
        "spans": report.spans,
        "turns": sum(len(m) for m in by_session.values()),
        "batches": report.batches,
        "retries": report.retries,
        "stopped_repeating": report.stopped_repeating,
        "dead_letters": report.dead,
        "facts": len(facts),
        "dropped": dict(report.dropped),
        "seconds": round(seconds, 1),
        "spans_per_min": round(report.spans / seconds * 60, 2) if seconds else None,
        "seconds_per_fact": round(seconds / len(facts), 1) if facts else None,
        "model_calls": counts["calls"],
        "tokens_read": counts["prompt_tokens"],
        "tokens_written": counts["completion_tokens"],
        "model_seconds": round(counts["seconds"], 1),
        "statements": facts,
    }


@standalone_measure(
    "harvest_speed",
    "consolidation on the embedded model (needs --data): spans a minute, seconds a fact, tokens read and written",
)
def harvest_speed(config: BenchConfig, progress: Progress) -> dict[str, Any]:
    try:
        import llama_cpp  # noqa: F401
    except ImportError:
        return {"skipped": "llama-cpp-python is not installed (pip install 'loomrt[local]')"}
    if config.data is None:
        return {"skipped": "needs a LoCoMo-format file: --data FILE"}
    from loomrt.bench.locomo_recall import load_locomo, sample_id

    model = config.model if config.model and config.model.startswith("local/") else "local/qwen2.5-coder-1.5b"
    samples = [(sample_id(s, i), s) for i, s in enumerate(load_locomo(config.data))]
    cid, sample = next(((c, s) for c, s in samples if not config.conversations or c in config.conversations))
    sessions = 2 if config.quick else SESSIONS
    progress.start(f"harvest speed · {model} · {cid} · {sessions} sessions", 1)
    with tempfile.TemporaryDirectory() as tmp:
        figures = asyncio.run(consolidated(Path(tmp), sample, cid, sessions, model))
    progress.advance()
    figures.pop("statements")
    goal = round(4 * BEFORE_SPANS_PER_MIN, 2)
    return {
        "model": model,
        "conversation": cid,
        "sessions": sessions,
        **figures,
        "goal_spans_per_min": goal,
        # spans a minute with nothing extracted is not consolidation
        "goal_met": figures["facts"] > 0 and (figures["spans_per_min"] or 0) >= goal,
    }
