"""The record on SQLite: a real file in WAL mode, checkpointed by a thread, migrations named,
ordered, recorded and idempotent (the store protocol on both backends: test_store_backends.py)."""

from __future__ import annotations

import sqlite3
import threading

import pytest
from spine_kit import agents_from, kinds, runtime, tool_call, write

from loomrt import RunInfo, SQLiteStore, StoreError
from loomrt.record import default_store
from loomrt.record import migrations as migrations_module
from loomrt.record.migrations import MIGRATIONS, migrate
from loomrt.testing import ScriptedProvider


def new_run(store: SQLiteStore, run_id: str, agent: str = "a", created_at: float | None = None) -> None:
    info = RunInfo(run_id=run_id, agent=agent, def_hash="h", mode="append", model="m")
    if created_at is not None:
        info = info.model_copy(update={"created_at": created_at})
    store.create_run(info)


@pytest.fixture
def store(tmp_path):
    s = SQLiteStore(tmp_path / "record.sqlite")
    yield s
    s.close()


def test_the_store_has_no_way_to_change_or_delete():
    public = {name for name in dir(SQLiteStore) if not name.startswith("_")}
    assert public == {
        "append",
        "append_many",
        "cards",
        "children",
        "close",
        "commits",
        "create_run",
        "events",
        "get_run",
        "head",
        "latest",
        "lease_holder",
        "list_runs",
        "pending",
        "read",
        "release_lease",
        "take_lease",
        "claim_run",
        "release_run",
        "renew_run",
        "stalled_runs",
        "run_owners",
        "run_sums",
        "shared",
        "write",
        "transaction",
        "write_many",
        "write_run",
    }


def test_the_file_is_in_wal_mode(tmp_path, store):
    raw = sqlite3.connect(tmp_path / "record.sqlite")
    assert raw.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    raw.close()


def test_the_wal_is_checkpointed_by_a_thread_never_inside_a_commit(tmp_path, store):
    """A commit never copies the log into the database file (that took one append in a few
    hundred from 0.1 ms to 14 ms); the checkpoint thread does, shortly after."""
    import time

    assert store._conn.execute("PRAGMA wal_autocheckpoint").fetchone()[0] == 0
    db = tmp_path / "record.sqlite"
    new_run(store, "r1")
    time.sleep(0.6)  # the thread has checkpointed the schema and the run
    before = db.stat().st_size
    for i in range(300):
        store.append("r1", "user_input", {"content": f"message {i} " + "x" * 2000})
    deadline = time.monotonic() + 10
    while db.stat().st_size <= before + 300 * 2000 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert db.stat().st_size > before + 300 * 2000, "no checkpoint copied the log into the database file"
    assert [e.seq for e in SQLiteStore(db).events("r1")] == list(range(1, 301))


def test_an_unopenable_path_is_a_store_error(tmp_path):
    folder = tmp_path / "a-folder"
    folder.mkdir()
    with pytest.raises(StoreError, match="cannot open the record at .*a-folder.*set LOOMRT_HOME"):
        SQLiteStore(folder)


def test_the_default_store_lives_under_loomrt_home(tmp_path, monkeypatch):
    monkeypatch.setenv("LOOMRT_HOME", str(tmp_path / "home"))
    s = default_store()
    assert s.path == tmp_path / "home" / "record.sqlite"
    assert s.path.is_file()
    s.close()


# ---------------------------------------------------------------- migrations


def test_migrations_are_recorded_by_name_in_order(tmp_path, store):
    raw = sqlite3.connect(tmp_path / "record.sqlite")
    names = [r[0] for r in raw.execute("SELECT name FROM _migrations ORDER BY rowid")]
    assert names == [name for name, _ in MIGRATIONS]
    assert names == sorted(names)
    raw.close()


def test_migrations_are_idempotent(tmp_path, store):
    path = tmp_path / "record.sqlite"
    new_run(store, "r")
    store.append("r", "notice", {})
    raw = sqlite3.connect(path)
    before = raw.execute("SELECT name, applied_at FROM _migrations ORDER BY name").fetchall()
    assert migrate(raw) == []
    SQLiteStore(path).close()  # opening again applies nothing
    assert raw.execute("SELECT name, applied_at FROM _migrations ORDER BY name").fetchall() == before
    assert [e.seq for e in SQLiteStore(path).events("r")] == [1]
    raw.close()


def test_a_new_migration_applies_once_to_an_existing_record(tmp_path, store, monkeypatch):
    path = tmp_path / "record.sqlite"
    monkeypatch.setattr(migrations_module, "MIGRATIONS", [*MIGRATIONS, ("9999_notes", "CREATE TABLE notes (x TEXT);")])
    raw = sqlite3.connect(path)
    assert migrate(raw) == ["9999_notes"]
    assert migrate(raw) == []
    assert raw.execute("SELECT count(*) FROM _migrations WHERE name = '9999_notes'").fetchone() == (1,)
    raw.close()


def test_a_failing_migration_leaves_nothing_behind(tmp_path, store, monkeypatch):
    path = tmp_path / "record.sqlite"
    broken = "CREATE TABLE half_done (x TEXT);\nCREATE TABLE half_done (x TEXT);"
    monkeypatch.setattr(migrations_module, "MIGRATIONS", [*MIGRATIONS, ("9999_broken", broken)])
    raw = sqlite3.connect(path, isolation_level=None)
    with pytest.raises(sqlite3.OperationalError, match="already exists"):
        migrate(raw)
    tables = {r[0] for r in raw.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    assert "half_done" not in tables
    assert raw.execute("SELECT count(*) FROM _migrations WHERE name = '9999_broken'").fetchone() == (0,)
    raw.close()


def test_two_stores_opening_a_fresh_file_at_once_both_succeed(tmp_path):
    path = tmp_path / "fresh.sqlite"
    errors: list[BaseException] = []
    stores: list[SQLiteStore] = []

    def open_store() -> None:
        try:
            stores.append(SQLiteStore(path))
        except BaseException as exc:  # noqa: BLE001 - collected for the assertion
            errors.append(exc)

    threads = [threading.Thread(target=open_store) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    raw = sqlite3.connect(path)
    assert raw.execute("SELECT count(*) FROM _migrations").fetchone() == (len(MIGRATIONS),)
    raw.close()
    for s in stores:
        s.close()


# ---------------------------------------------------------------- a run's record


def test_a_run_records_every_step_in_order(tmp_path):
    provider = ScriptedProvider(
        turns=[
            {**tool_call("calculate", expression="6*7"), "usage": {"input_tokens": 120, "output_tokens": 9}},
            {"text": "42", "usage": {"input_tokens": 150, "output_tokens": 2}},
        ]
    )
    write(tmp_path, "s.yaml", "turns: []\n")
    agents = agents_from(
        tmp_path, "agents:\n  calc: {model: scripted/s.yaml, system_prompt: Compute., tools: [calculate]}\n"
    )
    rt = runtime(tmp_path, provider)
    result = rt.run_sync("calc", "what is 6*7?", agents=agents)
    assert (result.status, result.output) == ("done", "42")
    assert kinds(rt, result.run_id) == [
        "run_started",
        "user_input",
        "model_call",
        "assistant_message",
        "tool_call",
        "tool_result",
        "model_call",
        "assistant_message",
        "final",
    ]
    ev = rt.store.events(result.run_id)
    assert ev[0].data["agent"] == "calc" and ev[0].data["definition"]["tools"] == ["calculate"]
    assert ev[0].data["def_hash"] == rt.store.get_run(result.run_id).def_hash
    assert ev[1].data == {"content": "what is 6*7?"}
    assert ev[2].data["usage"] == {"input_tokens": 120, "output_tokens": 9, "cached_tokens": 0}
    assert ev[4].data == {"id": "call_1_0", "name": "calculate", "arguments": {"expression": "6*7"}}
    assert ev[5].data == {"tool_call_id": "call_1_0", "name": "calculate", "content": "42", "is_error": False}
    assert ev[8].data == {"output": "42", "state": None}
    # totals add up from the record
    assert (result.usage.input_tokens, result.usage.output_tokens, result.model_calls) == (270, 11, 2)
    info = rt.store.get_run(result.run_id)
    assert (info.status, info.agent, info.mode, info.last_seq) == ("done", "calc", "append", 9)


def test_the_run_core_awaits_the_store_and_a_store_that_waits_needs_the_async_entry_points(tmp_path):
    import asyncio

    from loomrt import AgentSpec, Runtime

    class WaitingStore(SQLiteStore):
        """A store whose writes wait on I/O, as a network database's do."""

        async def write_many(self, run_id, items):
            await asyncio.sleep(0)
            return self.append_many(run_id, items)

    store = WaitingStore(tmp_path / "record.sqlite")
    rt = Runtime(store, providers=lambda spec, model: ScriptedProvider(["hello", "again"]))
    spec = AgentSpec(model="scripted/x")
    with pytest.raises(StoreError, match="use the async form"):
        rt.start(spec)

    async def play():
        run = await rt.astart(spec, interactive=True)
        first = await rt.send(run, "hi")
        reopened = await rt.aopen(run.run_id)
        second = await rt.send(reopened, "hi again")
        return first, second, await rt.afinish(reopened)

    first, second, done = asyncio.run(play())
    assert (first.output, second.output, done.status) == ("hello", "again", "done")


def test_the_store_is_chosen_in_one_place_from_configuration(tmp_path, monkeypatch, postgres_url):
    monkeypatch.setenv("LOOMRT_DB_URL", f"sqlite:{tmp_path / 'elsewhere.sqlite'}")
    assert default_store().path == tmp_path / "elsewhere.sqlite"
    monkeypatch.setenv("LOOMRT_DB_URL", "mysql://db.example/loomrt")
    with pytest.raises(StoreError, match=r"not a store this version of loomrt has \(sqlite:PATH or postgresql://"):
        default_store()
    from loomrt.record.postgres import PostgresStore

    monkeypatch.setenv("LOOMRT_DB_URL", postgres_url)
    chosen = default_store()
    assert isinstance(chosen, PostgresStore) and chosen.url == postgres_url
    chosen.close()


def test_an_explicit_sqlite_url_in_a_missing_folder_is_refused_not_created(tmp_path, monkeypatch):
    missing = tmp_path / "no" / "such" / "dir"
    with pytest.raises(StoreError, match=r"the record's folder .*no/such/dir does not exist"):
        default_store(f"sqlite:{missing / 'x.db'}")
    assert not (tmp_path / "no").exists(), "nothing was created"
    monkeypatch.setenv("LOOMRT_HOME", str(tmp_path / "home" / "made"))
    monkeypatch.delenv("LOOMRT_DB_URL", raising=False)
    store = default_store()  # a path the program chooses itself is still created
    assert store.path.parent.is_dir()
    store.close()


def test_events_of_some_kinds_are_the_same_whichever_way_the_store_reads_them(store):
    """A few events of a long run are read kind by kind down the kind index, many by walking
    the range: both give exactly the events a filter over the whole run gives, in seq order."""
    new_run(store, "r")
    store.append("r", "run_started", {"task": "t"})
    for i in range(700):  # over 1,024 seqs: a shorter range is always walked
        store.append("r", "user_input", {"content": f"u{i}"})
        store.append("r", "assistant_message", {"message": {"role": "assistant", "content": f"a{i}"}})
        if i % 50 == 7:
            store.append("r", "mark_private", {"seq": 2 * i + 2, "by": "operator"})
        if i % 90 == 3:
            store.append("r", "declassify", {"seq": 2 * i + 2, "by": "operator"})
    every = store.events("r")
    for wanted in (
        ["mark_private", "declassify"],
        ["declassify", "run_started", "mark_private", "declassify"],  # a kind asked twice is read once
        ["user_input", "mark_private"],
    ):
        for after, until in ((0, None), (40, 1400), (250, 251), (100, None), (0, 10**6), (5, 3)):
            want = [e for e in every if e.kind in wanted and e.seq > after and (until is None or e.seq <= until)]
            assert store.events("r", kinds=wanted, after=after, until=until) == want
    assert store.events("nobody", kinds=["mark_private", "declassify"]) == []
