"""Durable-memory search on both backends: the same stored texts, the same questions.

SQLite searches facts in the process (a recall index per scope: BM25 plus exact cosine);
PostgreSQL searches them in the database (BM25 over full-text lexemes, cosine through
pgvector's HNSW index). Parity is measured, not assumed:

- **parity**: the LoCoMo turns of ``--data`` imported verbatim as facts (one scope per
  conversation; :meth:`~loomrt.harvest.memory.MemoryStore.import_facts`), queried with the
  conversation's answerable questions; a question is found at k when a fact of one of its
  evidence turns is among the top k. The bar: R@5 within 0.02 between the backends. It can
  fail: the approximate index missing near neighbours, or the database's lexical scoring
  ranking otherwise than recall's BM25, moves PostgreSQL's figure alone.
- **latency**: search p50 and p95 over ``facts`` facts (10,000; synthetic prose) in one
  scope, the query embedding included (the same on both).
"""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["parity_figures", "latency_figures", "LATENCY_FACTS"]

LATENCY_FACTS = 10_000


def _recall_at(memory: Any, questions: Sequence[tuple[str, str, set[str]]], ks: Sequence[int]) -> dict[str, Any]:
    hits = {k: 0 for k in ks}
    for scope, question, gold in questions:
        found = [h.id for h in memory.search(question, max(ks), [scope])]
        for k in ks:
            hits[k] += bool(gold & set(found[:k]))
    n = len(questions)
    return {"questions": n, **{f"r@{k}": round(hits[k] / n, 4) if n else 0.0 for k in ks}}


def parity_figures(
    open_memory: Callable[[str], Any],
    samples: list[dict[str, Any]],
    *,
    backends: Sequence[str] = ("sqlite", "postgres"),
) -> dict[str, Any]:
    """R@1 and R@5 of each backend's memory (``open_memory(backend)``) on the same imported
    turns and questions."""
    from loomrt.bench.locomo_recall import ANSWERABLE, evidence_ids, render_turn, sample_id, turns_of

    out: dict[str, Any] = {}
    for backend in backends:
        memory = open_memory(backend)
        questions = []
        facts = 0
        for i, sample in enumerate(samples):
            scope = f"project:{sample_id(sample, i)}"
            turns = turns_of(sample)
            ids = memory.import_facts([(scope, render_turn(t)) for t in turns])
            facts += len(set(ids))
            by_dia = {t.dia_id: fid for t, fid in zip(turns, ids, strict=True)}
            for q in sample["qa"]:
                gold = {by_dia[d] for d in evidence_ids(q.get("evidence")) if d in by_dia}
                if q.get("category") in ANSWERABLE and gold:
                    questions.append((scope, str(q["question"]), gold))
        started = time.perf_counter()
        out[backend] = {
            **_recall_at(memory, questions, (1, 5)),
            "facts": facts,
            "search_s": round(time.perf_counter() - started, 1),
        }
    if all(b in out for b in ("sqlite", "postgres")):
        gap = round(abs(out["sqlite"]["r@5"] - out["postgres"]["r@5"]), 4)
        out["r@5_gap"] = gap
        out["within_0.02"] = gap <= 0.02
    return out


def latency_figures(memory: Any, *, facts: int = LATENCY_FACTS, queries: int = 200, seed: int = 7) -> dict[str, Any]:
    """Search p50/p95 (ms) over ``facts`` synthetic facts in one scope of ``memory``."""
    from loomrt.bench.textgen import prose

    rng = random.Random(seed)
    texts = [f"{prose(18, rng)} (note {i})" for i in range(facts)]
    started = time.perf_counter()
    for lo in range(0, facts, 1000):
        memory.import_facts([("project:latency", t) for t in texts[lo : lo + 1000]])
    load_s = time.perf_counter() - started
    asked = [prose(10, rng) for _ in range(queries)]
    memory.search(asked[0], 5, ["project:latency"])  # the first search builds what later ones reuse
    times = []
    for q in asked:
        t0 = time.perf_counter()
        memory.search(q, 5, ["project:latency"])
        times.append((time.perf_counter() - t0) * 1000)
    times.sort()
    return {
        "facts": facts,
        "queries": queries,
        "p50_ms": round(statistics.median(times), 2),
        "p95_ms": round(times[int(0.95 * (len(times) - 1))], 2),
        "import_s": round(load_s, 1),
    }
