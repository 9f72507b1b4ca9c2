"""A step's later appends on PostgreSQL go with its COMMIT (loomrt.record.pg_steps): fewer
calls to the server a turn, the same record (seqs, hashes, head anchor, cards), a read
inside the step that sees every write before it, and the claim still checked."""

from __future__ import annotations

import asyncio
from typing import Any

import psycopg
import pytest

from loomrt.errors import FencedError
from loomrt.events import RunInfo
from loomrt.record.ledger import verify_chain
from loomrt.record.postgres import PostgresStore


def _run(store: PostgresStore, run_id: str = "r1") -> None:
    store.create_run(RunInfo(run_id=run_id, agent="a", def_hash="h", mode="append", model="m"))


@pytest.mark.parametrize("deferred", [True, False], ids=["deferred", "sabotaged-every-append-sent"])
def test_a_steps_later_appends_go_with_its_commit(postgres_url: str, monkeypatch: Any, deferred: bool) -> None:
    """Three appends in a step cost two calls (the first append, which takes the run's lock
    and reads its head, and the commit) and record what three separate appends would: one
    chain that verifies, the head anchor at the last. Sabotage: with the
    deferral off, each append is a call of its own."""
    from loomrt.record.pg_steps import Pin

    if not deferred:
        monkeypatch.setattr(Pin, "defer", lambda self, *args: None)
    store = PostgresStore(postgres_url)
    _run(store)
    before = store.calls

    async def step() -> list[int]:
        async with store.transaction():
            first = await store.write("r1", "notice", {"message": "one"})
            second = await store.write("r1", "notice", {"message": "two"})
            third = await store.write_many("r1", [("notice", {"message": "three"}), ("notice", {"message": "four"})])
            return [first.seq, second.seq, *(e.seq for e in third)]

    try:
        seqs = asyncio.run(step())
        assert store.calls - before == (2 if deferred else 4)
        assert seqs == [1, 2, 3, 4]
        events = store.events("r1")
        assert [e.data["message"] for e in events] == ["one", "two", "three", "four"]
        assert [e.ts for e in events] == sorted(e.ts for e in events)
        assert store.head("r1")[:2] == (4, events[-1].hash)  # type: ignore[index]
        assert verify_chain(events) == []  # every hash follows from its content and the one before
    finally:
        store.close()


def test_a_deferred_distillations_cards_are_indexed_with_the_commit(postgres_url: str) -> None:
    store = PostgresStore(postgres_url)
    _run(store)
    card = {"id": "card-x", "depth": 0, "text": "a card"}

    async def step() -> None:
        async with store.transaction():
            await store.write("r1", "notice", {"message": "one"})
            await store.write("r1", "distillation", {"cards": [card]})

    try:
        asyncio.run(step())
        assert store.cards(["card-x"]) == {"card-x": card}
    finally:
        store.close()


def test_a_read_inside_the_step_sees_its_deferred_appends(postgres_url: str) -> None:
    store = PostgresStore(postgres_url)
    _run(store)

    async def step() -> list[str]:
        async with store.transaction():
            await store.write("r1", "notice", {"message": "one"})
            await store.write("r1", "notice", {"message": "two"})
            return [e.data["message"] for e in await store.read("r1")]

    try:
        assert asyncio.run(step()) == ["one", "two"]
        assert [e.data["message"] for e in store.events("r1")] == ["one", "two"]
    finally:
        store.close()


@pytest.mark.parametrize("found_by", ["the commit", "a read inside the step"])
def test_a_claim_overtaken_records_nothing_of_the_step(postgres_url: str, found_by: str) -> None:
    """The deferred append is fenced where its rows go to the server: at the commit, or before
    a read inside the step (which then raises). Another claimer's higher epoch, committed
    meanwhile, refuses the whole step (:class:`FencedError`), not only the rows sent."""
    store = PostgresStore(postgres_url)
    _run(store)
    epoch = store.claim_run("r1", "me", ttl_s=60)

    async def step() -> None:
        async with store.transaction():
            await store.write_many("r1", [("notice", {"message": "one"})], epoch=epoch)
            await store.write_many("r1", [("notice", {"message": "two"})], epoch=epoch)  # deferred
            with psycopg.connect(postgres_url, autocommit=True) as other:  # a newer claim's token
                other.execute("UPDATE run_epochs SET epoch = epoch + 1 WHERE run_id = %s", ("r1",))
            if found_by != "the commit":
                with pytest.raises(FencedError):
                    await store.read("r1")

    try:
        said = "" if found_by == "the commit" else "nothing of this step was recorded"
        with pytest.raises(FencedError, match=said):
            asyncio.run(step())
        assert store.events("r1") == []
    finally:
        store.close()


def test_deferred_times_never_run_behind_an_append_that_went_to_the_server(postgres_url: str) -> None:
    """An append of the step that goes to the server (here the sync face) moves the time the
    next deferred one starts from: the run's times stay in order, its chain whole."""
    store = PostgresStore(postgres_url)
    _run(store)

    async def step() -> None:
        async with store.transaction():
            await store.write("r1", "notice", {"message": "one"})
            await store.write("r1", "notice", {"message": "two"})  # deferred
            store.append_many("r1", [("notice", {"message": "three"})])  # to the server, sending "two" first
            await store.write("r1", "notice", {"message": "four"})  # deferred again

    try:
        asyncio.run(step())
        events = store.events("r1")
        assert [e.data["message"] for e in events] == ["one", "two", "three", "four"]
        assert [e.ts for e in events] == sorted(e.ts for e in events)
        assert verify_chain(events) == []
    finally:
        store.close()


def test_a_task_that_writes_after_its_step_ended_is_refused_not_lost(postgres_url: str) -> None:
    from loomrt.errors import StoreError

    store = PostgresStore(postgres_url)
    _run(store)

    async def late_write() -> None:
        await asyncio.sleep(0.3)
        await store.write("r1", "notice", {"message": "late"})

    async def step() -> None:
        async with store.transaction():
            await store.write("r1", "notice", {"message": "in the step"})
            late = asyncio.create_task(late_write())  # shares the step's context
        with pytest.raises(StoreError, match="after the block ended"):
            await late

    try:
        asyncio.run(step())
        assert [e.data["message"] for e in store.events("r1")] == ["in the step"]
    finally:
        store.close()


def test_a_step_that_writes_nothing_costs_no_call(postgres_url: str) -> None:
    store = PostgresStore(postgres_url)
    _run(store)
    before = store.calls

    async def step() -> None:
        async with store.transaction():
            pass

    try:
        asyncio.run(step())
        assert store.calls == before
    finally:
        store.close()
