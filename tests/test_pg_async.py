"""The PostgreSQL store is async for real: an append awaited on an event loop leaves that loop
free for the other runs (psycopg's async connections, on the store's own I/O loop), the sync
entry points still complete, and a write in flight is never cut in half by a cancellation."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import psycopg
import pytest

from loomrt.bench.store_concurrency import concurrent_turns
from loomrt.events import RunInfo
from loomrt.record.postgres import PostgresStore
from loomrt.runtime import Runtime
from loomrt.spec import AgentSpec


def _run(store: PostgresStore, run_id: str = "r1") -> None:
    store.create_run(RunInfo(run_id=run_id, agent="a", def_hash="h", mode="append", model="m"))


def _lock_run(url: str, for_s: float) -> Any:
    """Another connection takes run r1's append lock and lets it go after ``for_s`` seconds
    (a transaction: the lock holds until it ends); close it after."""
    holder = psycopg.connect(url)
    holder.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", ("r1",))
    threading.Timer(for_s, holder.commit).start()
    return holder


def test_chats_played_at_once_never_block_the_loop_on_the_record(postgres_url: str) -> None:
    store = PostgresStore(postgres_url)
    try:
        figures = asyncio.run(concurrent_turns(store, runs=4, turns=2))
    finally:
        store.close()
    assert figures["turns"] == 8
    assert figures["writes_per_turn"] >= 3  # the input, the answer, the park
    assert figures["loop_stalls_per_turn"] == 0  # claims, appends, reads: all awaited


def test_sabotage_one_append_made_synchronous_again_shows_as_a_stall_every_turn(
    postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    awaited = PostgresStore.write_many

    async def user_input_blocks(self: PostgresStore, run_id: str, items: list[Any], **kw: Any) -> Any:
        if any(kind == "user_input" for kind, _ in items):
            return self.append_many(run_id, items, **kw)  # the sync face, on the loop
        return await awaited(self, run_id, items, **kw)

    monkeypatch.setattr(PostgresStore, "write_many", user_input_blocks)
    store = PostgresStore(postgres_url)
    try:
        figures = asyncio.run(concurrent_turns(store, runs=4, turns=2))
    finally:
        store.close()
    assert figures["loop_stalls_per_turn"] >= 1


def test_the_loop_goes_on_while_an_append_waits_on_the_database(postgres_url: str) -> None:
    """Another connection holds the run's append lock for half a second: the append waits in
    the database, and the loop's other task ticks meanwhile."""
    store = PostgresStore(postgres_url)
    _run(store)
    holder = _lock_run(postgres_url, 0.5)

    async def main() -> tuple[int, float]:
        ticks = 0
        done = False

        async def ticker() -> None:
            nonlocal ticks
            while not done:
                ticks += 1
                await asyncio.sleep(0.01)

        tick = asyncio.create_task(ticker())
        started = time.perf_counter()
        await store.write("r1", "notice", {"message": "after the lock"})
        waited = time.perf_counter() - started
        done = True
        await tick
        return ticks, waited

    try:
        ticks, waited = asyncio.run(main())
    finally:
        holder.close()
        store.close()
    assert waited >= 0.4  # it did wait for the lock
    assert ticks >= 10  # and the loop was free all the while (a blocking append: 1 tick)


def test_the_sync_entry_points_complete_outside_and_inside_an_event_loop(postgres_url: str) -> None:
    from loomrt.providers.scripted import FunctionProvider

    store = PostgresStore(postgres_url)
    rt = Runtime(store, providers=lambda spec, model: FunctionProvider(lambda r: "ok"))
    spec = AgentSpec(model="function/inline", context={"mode": "append"})
    try:
        outside = rt.start(spec)

        async def inside() -> str:
            return rt.start(spec).run_id  # a sync call from async code: completes, blocking the loop

        within = asyncio.run(inside())
        assert store.latest(outside.run_id, "run_started") is not None
        assert store.latest(within, "run_started") is not None
        assert store.stalls >= 1  # the call from inside the loop is counted as what it is
    finally:
        store.close()


def test_a_write_cancelled_in_flight_completes_and_the_cancellation_follows(postgres_url: str) -> None:
    store = PostgresStore(postgres_url)
    _run(store)
    holder = _lock_run(postgres_url, 0.6)

    async def main() -> asyncio.Task[Any]:
        task = asyncio.create_task(store.write("r1", "notice", {"message": "in flight"}))
        await asyncio.sleep(0.2)  # the append waits on the lock, in the database
        task.cancel()
        await asyncio.sleep(0.1)
        assert not task.done()  # it is not cut off mid-write
        with pytest.raises(asyncio.CancelledError):
            await task
        return task

    try:
        asyncio.run(main())
        assert [e.data["message"] for e in store.events("r1", kinds=["notice"])] == ["in flight"]
    finally:
        holder.close()
        store.close()


def test_the_store_measure_reports_runs_at_once_and_the_goal(postgres_url: str, tmp_path: Any) -> None:
    from loomrt.bench.render_store import _concurrency
    from loomrt.bench.store_concurrency import concurrency_figures

    figures = concurrency_figures(str(tmp_path / "c.sqlite"), postgres_url, counts=(1, 3), turns_total=9)
    assert figures["sqlite_3"]["turns"] == figures["postgres_3"]["turns"] == 9
    assert figures["postgres_3"]["loop_stalls_per_turn"] == 0
    goal = figures["goal"]
    bound = (
        figures["sqlite_3"]["wall_ms_per_turn"] + figures["postgres_3"]["writes_per_turn"] * figures["round_trip_ms"]
    ) * 1.1
    assert goal["runs"] == 3 and abs(goal["bound_ms"] - bound) < 0.01
    assert goal["met"] == (goal["postgres_wall_ms_per_turn"] <= goal["bound_ms"])
    text = "\n".join(_concurrency(figures))
    assert "loop stalls / turn" in text and ("**met**" in text or "**missed**" in text)


def test_a_forked_child_is_told_to_open_the_store_again(postgres_url: str) -> None:
    import os

    from loomrt.errors import StoreError

    store = PostgresStore(postgres_url)
    try:
        store._io._pid = os.getpid() + 1  # what a forked child sees: the thread stayed in its parent
        with pytest.raises(StoreError, match="open the store again in this process"):
            store.events("r1")
    finally:
        store._io._pid = os.getpid()
        store.close()


def test_a_connection_idle_past_the_fresh_window_is_checked_before_it_is_handed_out(
    postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A server that dropped the pool's connections (a restart) is met by the pool's check,
    not by a caller; inside the fresh window the check is skipped, and a caller meets it once,
    as the record's error (which the run loop waits out)."""
    import loomrt.record.postgres as pg
    from loomrt.errors import StoreError

    def drop_connections() -> None:
        with psycopg.connect(postgres_url, autocommit=True) as admin:
            admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )

    store = PostgresStore(postgres_url, pool_size=1)
    try:
        _run(store)
        drop_connections()
        monkeypatch.setattr(pg, "FRESH_S", 0.0)  # every connection counts as idle: checked
        assert store.events("r1") == []
        drop_connections()
        monkeypatch.setattr(pg, "FRESH_S", 3600.0)  # none does: handed out unchecked
        with pytest.raises(StoreError, match="cannot read the record"):
            store.events("r1")
        assert store.events("r1") == []  # the broken one was thrown away
    finally:
        store.close()


def test_a_failed_write_inside_a_step_leaves_the_steps_other_writes_whole(postgres_url: str) -> None:
    """A statement that fails inside a transaction block (a duplicate run id) is undone alone
    (a savepoint); the block's append before it is committed with the block."""
    from loomrt.errors import StoreError

    store = PostgresStore(postgres_url)
    _run(store)

    async def step() -> None:
        async with store.transaction():
            await store.write("r1", "notice", {"message": "kept"})
            with pytest.raises(StoreError, match="already exists"):
                await store.write_run(RunInfo(run_id="r1", agent="a", def_hash="h", mode="append", model="m"))

    try:
        asyncio.run(step())
        assert [e.data["message"] for e in store.events("r1", kinds=["notice"])] == ["kept"]
    finally:
        store.close()


def test_a_timeout_during_a_write_is_the_timeouts_error_once_the_write_is_done(postgres_url: str) -> None:
    store = PostgresStore(postgres_url)
    _run(store)
    holder = _lock_run(postgres_url, 0.4)

    async def main() -> str:
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.1):
                await store.write("r1", "notice", {"message": "late"})
        await asyncio.sleep(0.01)  # no cancellation is left pending for what comes next
        return "went on"

    try:
        assert asyncio.run(main()) == "went on"
        assert [e.data["message"] for e in store.events("r1", kinds=["notice"])] == ["late"]
    finally:
        holder.close()
        store.close()


def test_a_write_that_fails_after_its_caller_was_cancelled_still_ends_the_caller(postgres_url: str) -> None:
    store = PostgresStore(postgres_url)
    _run(store)
    holder = _lock_run(postgres_url, 0.4)

    async def main() -> list[str]:
        reached: list[str] = []

        async def writer() -> None:
            await store.write_many("r1", [("notice", {"message": "x"})], after=99)  # refused: the run is at 0
            reached.append("after the write")

        task = asyncio.create_task(writer())
        await asyncio.sleep(0.1)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return reached

    try:
        assert asyncio.run(main()) == []
    finally:
        holder.close()
        store.close()


def test_a_closed_store_says_so(postgres_url: str) -> None:
    from loomrt.errors import StoreError

    store = PostgresStore(postgres_url)
    store.close()
    with pytest.raises(StoreError, match="store is closed"):
        store.events("r1")
    store.close()  # twice is fine


def test_a_recap_chat_distils_between_turns_without_blocking_the_loop(postgres_url: str) -> None:
    """The between-turns recap takes and gives back its lease off the loop (a worker thread)."""
    store = PostgresStore(postgres_url)
    spec = AgentSpec(model="function/inline", context={"mode": "recap", "budget_tokens": 256, "keep_last_n": 2})
    try:
        figures = asyncio.run(concurrent_turns(store, runs=2, turns=14, spec=spec))
        distilled = sum(len(store.events(r.run_id, kinds=["distillation"])) for r in store.list_runs())
    finally:
        store.close()
    assert distilled >= 2  # the chats did distil
    assert figures["loop_stalls_per_turn"] == 0


def test_a_blocks_first_append_refused_leaves_the_block_usable(postgres_url: str) -> None:
    """The first write of a step begins its transaction in the same round trip; refused (the
    run moved on), it is rolled back, and the step's next append begins it again."""
    from loomrt.errors import MovedOnError

    store = PostgresStore(postgres_url)
    _run(store)

    async def step() -> None:
        async with store.transaction():
            with pytest.raises(MovedOnError):
                await store.write_many("r1", [("notice", {"message": "refused"})], after=5)
            await store.write("r1", "notice", {"message": "kept"})
            await store.write("r1", "notice", {"message": "also kept"})

    try:
        asyncio.run(step())
        assert [e.data["message"] for e in store.events("r1", kinds=["notice"])] == ["kept", "also kept"]
    finally:
        store.close()


@pytest.mark.parametrize("off_loop", [True, False], ids=["off-the-loop", "sabotaged-read-on-the-loop"])
def test_durable_memory_on_postgresql_is_read_off_the_loop(
    postgres_url: str, off_loop: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Recall injection and the Recall tool read durable memory on PostgreSQL on a worker
    thread: while another connection locks the memory table for half a second, each waits
    for it and the loop's other task goes on ticking. Sabotaged (the read made on the loop
    again), the loop falls silent for the whole wait."""
    from loomrt.harvest.backends import memory_of
    from loomrt.harvest.db import harvest_db
    from loomrt.harvest.wiring import release
    from loomrt.providers.scripted import FunctionProvider
    from loomrt.recall.embedders import HashEmbedder
    from loomrt.recall.run_recall import RunRecall

    if not off_loop:
        monkeypatch.setattr(RunRecall, "memory_waits", lambda self: False)
    embedder = HashEmbedder(dim=384)
    memory_of(harvest_db(postgres_url), embedder).import_facts(
        [("user:alice", "The staging database listens on port 6543.")]
    )
    store = PostgresStore(postgres_url)
    provider = FunctionProvider(lambda request: "Noted.")
    runtime = Runtime(store, providers=lambda spec, model: provider, embedder=embedder, user="alice")
    spec = AgentSpec(
        model="function/inline",
        context={
            "mode": "compaction",
            "budget_tokens": 600,
            "recall": True,
            "recall_inject": "on",
            "recall_inject_tokens": 150,
            "memory_scopes": ["user"],
            "harvest_to_memory": False,
        },
    )

    async def longest_silence(work: Any) -> tuple[float, float, Any]:
        return await _while_locked(postgres_url, "memory_facts", work)

    async def main() -> list[tuple[float, float, Any]]:
        run = await runtime.astart(spec, interactive=True)
        await runtime.send(run, "Hello, a first turn loads what every later one reuses.")
        injected = await longest_silence(runtime.send(run, "Which port does the staging database listen on?"))
        recall = run.toolset.tools["Recall"]
        asked = await longest_silence(recall.call({"query": "staging database port", "source": "memory"}))
        return [injected, asked]

    try:
        (took_injected, gap_injected, _), (took_asked, gap_asked, answer) = asyncio.run(main())
        block = store.events(store.list_runs()[0].run_id, kinds=["recall_injected"])[-1].data
    finally:
        store.close()
        release(postgres_url)
    assert "port 6543" in " ".join(p["text"] for p in block["passages"])  # memory was read, and injected
    assert "port 6543" in answer
    assert took_injected >= 0.35 and took_asked >= 0.35  # each did wait for the lock
    if off_loop:
        assert gap_injected < 0.3 and gap_asked < 0.3  # the loop ticked all the while
    else:
        assert gap_injected >= 0.3 and gap_asked >= 0.3  # a read on the loop stops it for the wait


def test_one_append_of_more_events_than_a_statement_has_parameters(postgres_url: str) -> None:
    """An append's events go in as one array a column: 12,000 events in one call (six
    parameters each would pass PostgreSQL's 65,535) are written whole and chained."""
    from loomrt.record.ledger import verify_chain

    store = PostgresStore(postgres_url)
    _run(store)
    try:
        store.append_many("r1", [("notice", {"message": f"event {i}"}) for i in range(12_000)])
        events = store.events("r1")
        assert [e.data["message"] for e in events] == [f"event {i}" for i in range(12_000)]
        assert [e.seq for e in events] == list(range(1, 12_001))
        assert verify_chain(events) == []
        assert (store.head("r1") or (0,))[0] == 12_000  # the head anchor moved to the last
    finally:
        store.close()


def test_reopening_a_run_on_a_running_loop_does_not_block_it(postgres_url: str) -> None:
    """``aopen`` (MCP's recall and read tools reopen runs) reads the run's row off the loop."""
    from loomrt.providers.scripted import FunctionProvider

    store = PostgresStore(postgres_url)
    provider = FunctionProvider(lambda request: "Noted.")
    runtime = Runtime(store, providers=lambda spec, model: provider)

    async def main() -> int:
        run = await runtime.astart(AgentSpec(model="function/inline"), interactive=True)
        await runtime.send(run, "hello")
        before = store.stalls
        await runtime.aopen(run.run_id)
        return store.stalls - before

    try:
        assert asyncio.run(main()) == 0
    finally:
        store.close()


@pytest.mark.parametrize("off_loop", [True, False], ids=["off-the-loop", "sabotaged-banked-on-the-loop"])
def test_banking_an_evicted_span_on_postgresql_waits_off_the_loop(
    postgres_url: str, off_loop: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Banking a span for durable memory writes on a worker thread on PostgreSQL: while
    another connection locks the span queue for half a second, the bank waits for it and the
    loop's other task goes on ticking. Sabotaged (banked inline), the loop falls silent."""
    import loomrt.harvest.bank as bank_module
    from loomrt.harvest.bank import Bank
    from loomrt.harvest.db import harvest_db
    from loomrt.harvest.wiring import release
    from loomrt.messages import EvictedSpan, Message

    if not off_loop:
        monkeypatch.setattr(bank_module, "inline_wanted", lambda: True)
    recorded: list[tuple[str, dict[str, Any]]] = []
    bank = Bank(
        harvest_db(postgres_url),
        run_id="r1",
        agent="a",
        def_hash="h",
        scope="user:alice",
        max_tokens=8000,
        private=set,
        record=lambda kind, data: recorded.append((kind, data)),
    )
    span = EvictedSpan(
        "r1",
        "a",
        "compaction",
        9,
        (
            Message(role="user", content="The staging database listens on port 6543.", seq=3, ts=1.0),
            Message(role="assistant", content="Noted.", seq=4, ts=2.0),
        ),
    )

    async def banked() -> None:
        out = bank.on_evicted(span)
        if out is not None:
            await out

    async def main() -> float:
        return (await _while_locked(postgres_url, "harvest_spans", banked()))[1]

    try:
        gap = asyncio.run(main())
    finally:
        release(postgres_url)
    assert [(kind, data["outcome"]) for kind, data in recorded] == [("harvest_banked", "banked")]
    if off_loop:
        assert gap < 0.3  # the loop ticked all the while
    else:
        assert gap >= 0.3  # a write on the loop stops it for the wait


async def _while_locked(url: str, table: str, work: Any) -> tuple[float, float, Any]:
    """``work`` awaited while ``table`` is locked by another connection for 0.5 s: the seconds
    it took, the event loop's longest gap between ticks meanwhile, and what it returned."""
    holder = psycopg.connect(url)  # let go by a timer thread: a blocked loop could not
    holder.execute(f"LOCK TABLE {table} IN ACCESS EXCLUSIVE MODE")
    gaps, done = [0.0], False

    async def ticker() -> None:
        last = time.perf_counter()
        while not done:
            await asyncio.sleep(0.01)
            now = time.perf_counter()
            gaps.append(now - last)
            last = now

    tick = asyncio.create_task(ticker())
    await asyncio.sleep(0.02)
    timer = threading.Timer(0.5, holder.commit)
    timer.start()
    started = time.perf_counter()
    out = await work
    took = time.perf_counter() - started
    done = True
    await tick
    timer.join()
    holder.close()
    return took, max(gaps), out
