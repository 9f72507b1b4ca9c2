"""Runs played at once in one process, on each store: what the record costs a turn.

:func:`concurrent_turns` plays ``runs`` chats at once on one event loop (a worker's, an MCP
server's), each ``turns`` turns of a model that answers at once (so every second measured
is the runtime's and its record's), and returns the time per turn two ways: the turns'
median latency, and the wall time over every turn played (what the process gets through).

:func:`concurrency_figures` runs it on SQLite and on PostgreSQL, for 1 and for 100 runs, and
checks the goal of issue 46: with 100 runs at once, PostgreSQL's time per turn is at most
SQLite's plus (the store writes a turn makes × the median round trip to the server), plus
10%. A store whose appends block the event loop serialises every run's round trips, and
misses it; :attr:`~loomrt.record.postgres.PostgresStore.stalls` counts those blocking calls
(sync store calls made on a running loop), the figure the sabotage test breaks.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from typing import Any

from loomrt.events import Event

__all__ = ["concurrent_turns", "concurrency_figures", "round_trip_ms"]


def _spec() -> Any:
    from loomrt.spec import AgentSpec

    return AgentSpec(model="function/inline", context={"mode": "append"})


async def concurrent_turns(store: Any, *, runs: int, turns: int, spec: Any = None) -> dict[str, Any]:
    """Play ``runs`` chats of ``turns`` turns at once on ``store`` (of ``spec``, else an append
    agent): seconds per turn, the store writes per turn, and (PostgreSQL) the store calls that
    blocked the loop."""
    from loomrt.providers.scripted import FunctionProvider
    from loomrt.runtime import Runtime

    provider = FunctionProvider(lambda request: "Noted.")
    runtime = Runtime(store, providers=lambda spec, model: provider)
    writes = 0
    write_many = store.write_many

    async def counted(*args: Any, **kw: Any) -> list[Event]:
        nonlocal writes
        writes += 1
        events: list[Event] = await write_many(*args, **kw)
        return events

    latencies: list[float] = []

    async def chat(i: int) -> None:
        run = await runtime.astart(spec or _spec(), interactive=True)
        for t in range(turns):
            started = time.perf_counter()
            result = await runtime.send(run, f"Turn {t} of chat {i}: please note it.")
            latencies.append(time.perf_counter() - started)
            if result.error:
                raise RuntimeError(f"chat {i} turn {t} failed: {result.error}")

    stalls_before, calls_before = getattr(store, "stalls", 0), getattr(store, "calls", None)
    store.write_many = counted
    try:
        started = time.perf_counter()
        await asyncio.gather(*(chat(i) for i in range(runs)))
        wall = time.perf_counter() - started
    finally:
        del store.write_many  # the class's method again
    played = runs * turns
    stalls = getattr(store, "stalls", 0) - stalls_before
    calls = None if calls_before is None else store.calls - calls_before
    return {
        "runs": runs,
        "turns": played,
        "turn_ms_median": round(statistics.median(latencies) * 1000, 3),
        "wall_ms_per_turn": round(wall * 1000 / played, 3),
        "writes_per_turn": round(writes / played, 2),
        "loop_stalls_per_turn": round(stalls / played, 2),
        "server_calls_per_turn": None if calls is None else round(calls / played, 2),
    }


def round_trip_ms(url: str, n: int = 200) -> float:
    """The median round trip to the server at ``url``: ``SELECT 1`` on one connection, ms."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SELECT 1").fetchone()
        times = []
        for _ in range(n):
            t0 = time.perf_counter()
            conn.execute("SELECT 1").fetchone()
            times.append((time.perf_counter() - t0) * 1000)
    return round(statistics.median(times), 4)


def concurrency_figures(
    sqlite_path: str, pg_url: str, *, counts: tuple[int, ...] = (1, 100), turns_total: int = 400
) -> dict[str, Any]:
    """:func:`concurrent_turns` on a SQLite file and a migrated PostgreSQL database, for each
    count of runs at once (``turns_total`` turns in all, at least 3 a run); the goal at the largest."""
    from loomrt.record.postgres import PostgresStore
    from loomrt.record.sqlite import SQLiteStore

    out: dict[str, Any] = {"round_trip_ms": round_trip_ms(pg_url)}
    stores: dict[str, Any] = {"sqlite": SQLiteStore(sqlite_path), "postgres": PostgresStore(pg_url)}
    try:
        for n in counts:
            turns = max(3, turns_total // n)
            for name, store in stores.items():
                out[f"{name}_{n}"] = asyncio.run(concurrent_turns(store, runs=n, turns=turns))
    finally:
        for store in stores.values():
            store.close()
    top = max(counts)
    sq, pg = out[f"sqlite_{top}"], out[f"postgres_{top}"]
    bound = (sq["wall_ms_per_turn"] + pg["writes_per_turn"] * out["round_trip_ms"]) * 1.10
    out["goal"] = {
        "runs": top,
        "postgres_wall_ms_per_turn": pg["wall_ms_per_turn"],
        "bound_ms": round(bound, 3),
        "met": pg["wall_ms_per_turn"] <= bound,
    }
    return out
