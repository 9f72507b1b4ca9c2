"""The store protocol on both backends: every test here runs against SQLite and against a
real PostgreSQL server (``tests/conftest.py`` starts one), so neither can drift."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

from loomrt import NotFoundError, RunInfo, Store, StoreError
from loomrt.errors import MovedOnError
from loomrt.record.ledger import verify_chain


@pytest.fixture(params=["sqlite", "postgres"])
def backend(request: pytest.FixtureRequest, tmp_path: Any) -> Any:
    """``(open, direct)``: ``open()`` opens a store on this test's record (call it again for
    a second connection); ``direct(sql)`` runs SQL on it outside loomrt."""
    if request.param == "sqlite":
        import sqlite3

        from loomrt import SQLiteStore

        path = tmp_path / "record.sqlite"

        def direct_sqlite(sql: str) -> None:
            raw = sqlite3.connect(path)
            try:
                raw.execute(sql)
                raw.commit()
            finally:
                raw.close()

        return (lambda: SQLiteStore(path)), direct_sqlite
    import psycopg

    from loomrt.record.postgres import PostgresStore

    url = request.getfixturevalue("postgres_url")

    def direct_pg(sql: str) -> None:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(sql)

    return (lambda: PostgresStore(url)), direct_pg


@pytest.fixture
def store(backend: Any) -> Any:
    s = backend[0]()
    yield s
    s.close()


def new_run(store: Any, run_id: str, agent: str = "a", created_at: float | None = None, **kw: Any) -> None:
    info = RunInfo(run_id=run_id, agent=agent, def_hash="h", mode="append", model="m", **kw)
    if created_at is not None:
        info = info.model_copy(update={"created_at": created_at})
    store.create_run(info)


def test_the_store_satisfies_the_protocol(store: Any) -> None:
    assert isinstance(store, Store)


def test_seqs_are_monotonic_per_run_and_independent_across_runs(store: Any) -> None:
    new_run(store, "a")
    new_run(store, "b")
    seqs = [store.append(run, "notice", {"i": i}).seq for i, run in enumerate("aabab")]
    assert seqs == [1, 2, 1, 3, 2]
    assert [e.seq for e in store.events("a")] == [1, 2, 3]
    assert [e.data["i"] for e in store.events("a")] == [0, 1, 3]
    assert [e.seq for e in store.events("a", after=1)] == [2, 3]
    assert [e.seq for e in store.events("a", after=1, until=2)] == [2]


def test_concurrent_writers_on_separate_connections_never_share_a_seq(backend: Any, store: Any) -> None:
    new_run(store, "r")
    other = backend[0]()

    def writer(s: Any, tag: str) -> None:
        for i in range(40):
            s.append("r", "notice", {"tag": tag, "i": i})

    threads = [threading.Thread(target=writer, args=(s, t)) for s, t in ((store, "x"), (other, "y"), (store, "z"))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    got = store.events("r")
    assert [e.seq for e in got] == list(range(1, 121))
    for tag in "xyz":
        assert [e.data["i"] for e in got if e.data["tag"] == tag] == list(range(40))
    assert verify_chain(got) == []
    other.close()


def test_event_data_round_trips_exactly_and_the_chain_verifies(store: Any) -> None:
    new_run(store, "r")
    data = {"text": "Σ — naïve ✓ \x00 nul", "nested": {"z": [1, 2.5, None, True], "a": 1e-7}, "empty": {}}
    written = store.append("r", "state_update", data)
    (read,) = store.events("r")
    assert read.data == written.data == data
    assert (read.ts, read.kind, read.hash) == (written.ts, "state_update", written.hash)
    assert verify_chain(store.events("r")) == []


def test_events_filter_by_kind_and_latest_finds_the_last_of_a_kind(store: Any) -> None:
    new_run(store, "r")
    for kind in ("user_input", "model_call", "assistant_message", "model_call"):
        store.append("r", kind, {})
    assert [e.seq for e in store.events("r", kinds=["model_call"])] == [2, 4]
    assert store.latest("r", "model_call").seq == 4
    assert store.latest("r", "model_call", until=3).seq == 2
    assert store.latest("r", "final") is None


def test_run_status_is_derived_from_the_last_lifecycle_event(store: Any) -> None:
    new_run(store, "r")
    assert store.get_run("r").status == "active"
    for kind, status in [("parked", "parked"), ("notice", "parked"), ("user_input", "active"), ("final", "done")]:
        store.append("r", kind, {})
        info = store.get_run("r")
        assert (info.status, info.last_seq) == (status, len(store.events("r")))


def test_list_runs_children_and_unknown_ids(store: Any) -> None:
    new_run(store, "old", agent="x", created_at=1.0)
    new_run(store, "new", agent="y", created_at=3.0)
    new_run(store, "mid", agent="x", created_at=2.0, parent_run_id="old", root_run_id="old")
    assert [r.run_id for r in store.list_runs()] == ["new", "mid", "old"]
    assert [r.run_id for r in store.list_runs(agent="x")] == ["mid", "old"]
    assert [r.run_id for r in store.list_runs(limit=1)] == ["new"]
    assert [r.run_id for r in store.children("old")] == ["mid"]
    with pytest.raises(NotFoundError, match="no run 'nope' in .*`loomrt runs list` shows the runs"):
        store.get_run("nope")
    with pytest.raises(StoreError, match="run new already exists"):
        new_run(store, "new")
    with pytest.raises(StoreError, match="cannot append to the record of run ghost"):
        store.append("ghost", "notice", {})


def test_events_and_runs_can_never_be_changed_with_direct_sql(backend: Any, store: Any) -> None:
    new_run(store, "r1")
    store.append("r1", "user_input", {"content": "hello"})
    for sql in (
        "UPDATE events SET data = '{}'",
        "DELETE FROM events",
        "UPDATE runs SET mode = 'recap'",
        "DELETE FROM runs",
    ):
        with pytest.raises(Exception, match="append-only"):
            backend[1](sql)
    assert [e.data for e in store.events("r1")] == [{"content": "hello"}]
    assert store.get_run("r1").mode == "append"


def test_a_fork_continues_its_parents_seqs(store: Any) -> None:
    new_run(store, "p")
    for i in range(3):
        store.append("p", "notice", {"i": i})
    new_run(store, "f", forked_from="p", fork_seq=2)
    assert store.append("f", "run_started", {"forked_from": {"run_id": "p", "seq": 2}}).seq == 3


def test_cards_are_indexed_once_by_id(store: Any) -> None:
    new_run(store, "r")
    card = {"id": "c1", "depth": 0, "summary": "s"}
    store.append("r", "distillation", {"cards": [card]})
    store.append("r", "distillation", {"cards": [card, {"id": "c2", "depth": 1, "summary": "t"}]})
    assert store.cards(["c2", "c1", "nope"]) == {"c1": card, "c2": {"id": "c2", "depth": 1, "summary": "t"}}
    assert store.cards([]) == {}


def test_write_many_is_all_or_nothing_and_after_refuses_a_moved_on_run(store: Any) -> None:
    new_run(store, "r")

    async def play() -> None:
        await store.write_many("r", [("notice", {"i": 1}), ("notice", {"i": 2})])
        with pytest.raises(MovedOnError, match="moved on"):
            await store.write_many("r", [("notice", {"i": 3})], after=1)
        await store.write_many("r", [("notice", {"i": 3})], after=2)

    asyncio.run(play())
    assert [e.data["i"] for e in store.events("r")] == [1, 2, 3]


def test_a_transaction_commits_its_appends_together(backend: Any, store: Any) -> None:
    new_run(store, "r")
    watcher = backend[0]()
    seen_inside: list[int] = []

    async def play() -> None:
        async with store.transaction():
            await store.write("r", "notice", {"i": 1})
            async with store.transaction():  # blocks nest
                await store.write("r", "notice", {"i": 2})
            seen_inside.append(len(watcher.events("r")))

    asyncio.run(play())
    assert seen_inside == [0]  # another connection saw nothing before the commit
    assert [e.data["i"] for e in watcher.events("r")] == [1, 2]
    watcher.close()


def test_leases_are_exclusive_until_released_or_expired(store: Any) -> None:
    assert store.take_lease("fold:r", "w1", 30)
    assert not store.take_lease("fold:r", "w2", 30)
    assert store.take_lease("fold:r", "w1", 30)  # its own: renewed
    assert store.lease_holder("fold:r") == "w1"
    store.release_lease("fold:r", "w2")  # not its to give back
    assert store.lease_holder("fold:r") == "w1"
    store.release_lease("fold:r", "w1")
    assert store.lease_holder("fold:r") is None
    assert store.take_lease("fold:r", "w2", -1)  # already expired
    assert store.lease_holder("fold:r") is None
    assert store.take_lease("fold:r", "w3", 30)


def test_pending_lists_runs_with_work_queued_after_it_was_last_settled(store: Any) -> None:
    for run in ("a", "b", "c"):
        new_run(store, run)
    store.append("a", "fold_queued", {})
    store.append("b", "fold_queued", {})
    store.append("b", "distillation", {})
    store.append("c", "distillation", {})
    store.append("c", "fold_queued", {})
    assert store.pending("fold_queued", ["distillation"]) == ["a", "c"]


def test_a_keyed_run_and_its_head_anchor_on_either_backend(backend: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    import uuid

    from loomrt.record.ledger import KEY_ENV, genesis

    key = "a-key-both-backends-share-0001"
    monkeypatch.setenv(KEY_ENV, key)
    store = backend[0]()
    run_id = f"k{uuid.uuid4().hex[:8]}"
    new_run(store, run_id)
    store.append(run_id, "run_started", {"mode": "append"})
    store.append_many(run_id, [("user_input", {"content": "x"}), ("notice", {"text": "y"})])
    info = store.get_run(run_id)
    events = store.events(run_id)
    assert info.chain == "v2"
    assert verify_chain(events, scheme="v2", key=key.encode(), start=genesis(info, key.encode())) == []
    assert store.head(run_id) == (3, events[-1].hash, 0)
    for sql in (
        f"UPDATE run_heads SET seq = 1 WHERE run_id = '{run_id}'",
        f"DELETE FROM run_heads WHERE run_id = '{run_id}'",
    ):
        with pytest.raises(Exception, match="run head"):
            backend[1](sql)
    store.close()
    monkeypatch.delenv(KEY_ENV)
    keyless = backend[0]()
    with pytest.raises(StoreError, match="keyed \\(chain v2\\)"):
        keyless.append(run_id, "notice", {"text": "z"})
    keyless.close()


def test_run_sums_read_every_row_in_one_grouped_query(store: Any) -> None:
    """The runs row's sums (issue 47): tokens of every model call, distillations, turns, the
    first input and whether it is private (its last mark or declassify), the last activity."""
    new_run(store, "a")
    new_run(store, "b")
    new_run(store, "empty")
    call = {"purpose": "turn", "usage": {"input_tokens": 100, "output_tokens": 7, "cached_tokens": 40}}
    store.append("a", "user_input", {"content": "the task"})
    store.append("a", "model_call", call)
    store.append("a", "model_call", {"purpose": "recap", "usage": {"input_tokens": 30, "output_tokens": 5}})
    store.append("a", "distillation", {"context": []})
    store.append("a", "user_input", {"content": "more"})
    store.append("a", "model_call", {"purpose": "turn"})  # no usage: counts as a call, adds nothing
    last = store.append("a", "notice", {"x": 1})
    store.append("b", "notice", {"x": 1})
    first = store.append("b", "user_input", {"content": "secret"})
    store.append("b", "mark_private", {"seq": first.seq, "by": "user"})
    store.append("b", "declassify", {"seq": first.seq})
    store.append("b", "mark_private", {"seq": first.seq, "by": "user"})
    store.append("b", "mark_private", {"seq": 99, "by": "user"})  # another seq: not the task's

    sums = store.run_sums(["a", "b", "empty", "unknown", "a"])

    assert set(sums) == {"a", "b", "empty"}
    a = sums["a"]
    assert (a.input_tokens, a.output_tokens, a.cached_tokens) == (130, 12, 40)
    assert (a.model_calls, a.distillations, a.turns) == (3, 1, 2)
    assert (a.first_input, a.task, a.task_private) == (1, "the task", False)
    assert a.last_ts == pytest.approx(last.ts)
    b = sums["b"]
    assert (b.first_input, b.task, b.task_private, b.turns, b.model_calls) == (2, "secret", True, 1, 0)
    e = sums["empty"]
    assert (e.turns, e.input_tokens, e.task, e.last_ts) == (0, 0, None, None)
    assert store.run_sums([]) == {}
