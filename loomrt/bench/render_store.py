"""How the record's measures render: the store's appends and reads on each backend, runs played
at once (issue 46's goal), and the queue of detached runs."""

from __future__ import annotations

from typing import Any

from loomrt.bench.cells import md_table

__all__ = ["render_store"]


def render_store(s: dict[str, Any]) -> list[str]:
    """The store measure: the same appends and reads on each backend."""
    lines = ["### Store", ""]
    if s.get("measured"):  # run apart from the rest (`loomrt bench run store`), its results merged in
        m = s["measured"]
        lines += [f"Measured apart by `{m['command']}` ({m['when'][:16].replace('T', ' ')} UTC, {m['seconds']} s).", ""]
    lines += [
        f"{s['events']:,} events over {s['runs']} runs on each backend: half appended one at a "
        "time, half a turn's four at a time (`write_many`); then each run read whole.",
        "",
    ]
    rows = []
    for name in ("sqlite", "postgres"):
        f = s.get(name, {})
        if "skipped" in f:
            rows.append([name, "skipped", f["skipped"], "", ""])
        elif f:
            rows.append(
                [
                    name,
                    f"{f['single_events_per_s']:,}",
                    f"{f['batched_events_per_s']:,}",
                    f"{f['read_run_ms_median']:.2f}",
                    f.get("server", "a file on this machine"),
                ]
            )
    lines += md_table(
        [
            "backend",
            "events/s, one at a time",
            "events/s, four at a time",
            f"ms to read a run ({s.get('sqlite', {}).get('events_per_run', '?')} events)",
            "where",
        ],
        rows,
    )
    return (
        lines
        + [""]
        + _memory_search(s.get("memory") or {})
        + _queue(s.get("queue") or {})
        + _concurrency(s.get("concurrency") or {})
    )


def _concurrency(c: dict[str, Any]) -> list[str]:
    """Chats played at once in one process on each backend, and issue 46's goal."""
    if not c or "skipped" in c:
        return [f"Runs at once: skipped ({c['skipped']}).", ""] if c else []
    counts = sorted({int(k.rsplit("_", 1)[1]) for k in c if k.startswith(("sqlite_", "postgres_"))})
    rows = [
        [
            b,
            str(n),
            f"{f['turn_ms_median']:.2f}",
            f"{f['wall_ms_per_turn']:.2f}",
            f"{f['writes_per_turn']:.2f}",
            f"{f['loop_stalls_per_turn']:.2f}",
            "–" if f.get("server_calls_per_turn") is None else f"{f['server_calls_per_turn']:.2f}",
        ]
        for n in counts
        for b in ("sqlite", "postgres")
        if (f := c.get(f"{b}_{n}"))
    ]
    goal = c["goal"]
    return [
        "Chats played at once in one process (a model that answers at once, append mode): a turn's "
        "median latency, wall time over every turn played, the store writes a turn makes, the "
        "store calls that blocked the event loop, and (PostgreSQL) the calls a turn makes to the server "
        "(a step's appends after its first go with its commit).",
        "",
        *md_table(
            [
                "backend",
                "runs at once",
                "turn ms (median)",
                "wall ms / turn",
                "writes / turn",
                "loop stalls / turn",
                "server calls / turn",
            ],
            rows,
        ),
        "",
        f"Goal at {goal['runs']} runs: PostgreSQL's wall ms per turn ≤ (SQLite's + writes per turn × the median "
        f"round trip, {c['round_trip_ms']:.3f} ms) + 10% = {goal['bound_ms']:.2f} ms; measured "
        f"{goal['postgres_wall_ms_per_turn']:.2f} ms: **{'met' if goal['met'] else 'missed'}**.",
        "",
    ]


def _queue(q: dict[str, Any]) -> list[str]:
    """The harvest queue drained by several worker processes on each backend."""
    if not q:
        return []
    rows = []
    for b in ("sqlite", "postgres"):
        f = q.get(b) or {}
        if "skipped" in f:
            rows.append([b, "skipped", f["skipped"], "", ""])
        elif f:
            rows.append([b, str(f["lost"]), str(f["doubled"]), f"{f['seconds']:.1f}", f"{f['spans_per_s']:.1f}"])
    return [
        f"The harvest queue: {q['spans']:,} banked spans drained by {q['workers']} consolidator processes "
        "(echo extractor) on each backend.",
        "",
        *md_table(["backend", "lost", "doubled", "s", "spans/s"], rows),
        "",
    ]


def _memory_search(m: dict[str, Any]) -> list[str]:
    """Durable-memory search on each backend: latency, and R@k on the same imported turns."""
    if not m:
        return []
    lines = [
        "Durable-memory search (real embedder, the query's embedding included): SQLite in the process, "
        "PostgreSQL in the database (BM25 in SQL over a postings table, pgvector HNSW).",
        "",
    ]
    rows = [
        [b, f"{f['facts']:,}", f"{f['p50_ms']:.1f}", f"{f['p95_ms']:.1f}", f"{f['import_s']:.1f}"]
        for b, f in (m.get("latency") or {}).items()
    ]
    lines += md_table(["backend", "facts", "search p50 ms", "search p95 ms", "import s"], rows) + [""]
    parity = m.get("parity") or {}
    if "skipped" in parity:
        return lines + [f"Parity: skipped ({parity['skipped']}).", ""]
    rows = [
        [b, f"{f['facts']:,}", str(f["questions"]), f"{f['r@1']:.3f}", f"{f['r@5']:.3f}"]
        for b, f in parity.items()
        if isinstance(f, dict)
    ]
    lines += [
        "Parity: LoCoMo turns imported verbatim as facts (a scope per conversation), queried with its "
        "answerable questions; found at k when an evidence turn's fact is in the top k.",
        "",
    ]
    lines += md_table(["backend", "facts", "questions", "R@1", "R@5"], rows)
    if "r@5_gap" in parity:
        lines += [
            "",
            f"R@5 gap {parity['r@5_gap']:.3f}: {'within' if parity['within_0.02'] else '**outside**'} "
            "the 0.02 the issue asks for.",
        ]
    return lines + [""]
