"""PostgreSQL only: the migration policy, the application role, `loomrt db`, and real runs
on a real server (``tests/conftest.py`` starts one; the store protocol on both backends is
``tests/test_store_backends.py``)."""

from __future__ import annotations

import json
from typing import Any

import psycopg
import pytest
from spine_kit import write
from typer.testing import CliRunner

from loomrt import Runtime, SQLiteStore, StoreError, load_agents
from loomrt.cli import app
from loomrt.record import pg_migrations
from loomrt.record.ledger import verify_chain
from loomrt.record.migrations import MIGRATIONS
from loomrt.record.postgres import PostgresStore, redact_url
from loomrt.testing import ScriptedProvider

runner = CliRunner()


def _fresh_database(postgres_server: Any, name: str) -> str:
    base = postgres_server.get_uri()
    with psycopg.connect(base, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {name}")
        conn.execute(f"CREATE DATABASE {name}")
    return str(base.replace("/postgres?", f"/{name}?"))


def test_the_postgres_migrations_are_the_one_lists_names_in_its_order() -> None:
    from loomrt.harvest import db, pg
    from loomrt.jobs import schema

    assert list(pg_migrations.POSTGRES_SQL) == [name for name, _ in MIGRATIONS]
    assert list(pg.POSTGRES_SQL) == [name for name, _ in db.MIGRATIONS]
    assert list(schema.POSTGRES_SQL) == [name for name, _ in schema.MIGRATIONS]
    assert pg_migrations.names() == [*pg_migrations.POSTGRES_SQL, *pg.POSTGRES_SQL, *schema.POSTGRES_SQL]


def test_a_schema_behind_is_refused_with_the_command_and_a_newer_one_is_accepted(postgres_server: Any) -> None:
    url = _fresh_database(postgres_server, "behind")
    every = pg_migrations.names()
    with pytest.raises(
        StoreError, match=rf"behind this loomrt: {len(every)} migration\(s\) .* Run `loomrt db migrate`"
    ):
        PostgresStore(url)
    with psycopg.connect(url, autocommit=True) as conn:
        assert pg_migrations.migrate(conn, dry_run=True) == every
        assert pg_migrations.applied(conn) == []  # a dry run applies nothing
        assert pg_migrations.migrate(conn) == every
        assert pg_migrations.migrate(conn) == []  # idempotent
        conn.execute("INSERT INTO _migrations VALUES ('9999_from_a_newer_loomrt', 0)")  # a rolling upgrade
    store = PostgresStore(url)
    assert store.newer_migrations == ["9999_from_a_newer_loomrt"]
    store.close()


def test_the_application_role_can_read_and_append_but_never_change(postgres_server: Any, postgres_url: str) -> None:
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute("DROP ROLE IF EXISTS worker_login")
        conn.execute(f"CREATE ROLE worker_login LOGIN IN ROLE {pg_migrations.APP_ROLE}")
    as_app = postgres_url.replace("postgresql://postgres:@", "postgresql://worker_login@")
    store = PostgresStore(as_app)
    store.create_run(_info("r"))
    store.append("r", "user_input", {"content": "hi"})
    assert store.take_lease("fold:r", "w", 30)  # leases come and go: it may change them
    with psycopg.connect(as_app, autocommit=True) as conn:
        for sql in (
            "UPDATE events SET kind = 'x'",
            "DELETE FROM events",
            "TRUNCATE events",
            "UPDATE runs SET mode = 'x'",
            "TRUNCATE runs CASCADE",
        ):
            with pytest.raises(psycopg.errors.InsufficientPrivilege, match="permission denied"):
                conn.execute(sql)
    with psycopg.connect(postgres_url, autocommit=True) as owner:  # the owner is refused by the triggers
        with pytest.raises(psycopg.Error, match="append-only: TRUNCATE is refused on events"):
            owner.execute("TRUNCATE events")
    assert [e.data for e in store.events("r")] == [{"content": "hi"}]
    store.close()


def test_the_url_is_named_without_its_password() -> None:
    assert (
        redact_url("postgresql://app:s3cret@db.internal:5432/loomrt") == "postgresql://app:***@db.internal:5432/loomrt"
    )
    assert redact_url("postgresql://db.internal/loomrt") == "postgresql://db.internal/loomrt"


@pytest.mark.slow
def test_an_unreachable_server_is_one_clear_error(tmp_path: Any) -> None:
    # libpq says why, on one line, at once (the pool alone retried for 30 s and said only that)
    with pytest.raises(
        StoreError, match="cannot connect to the record at postgresql://u:\\*\\*\\*@.*failed: .*LOOMRT_DB_URL"
    ):
        PostgresStore(f"postgresql://u:pw@/x?host={tmp_path}&connect_timeout=1", pool_size=1)


def _info(run_id: str) -> Any:
    from loomrt import RunInfo

    return RunInfo(run_id=run_id, agent="a", def_hash="h", mode="append", model="m")


def test_a_scripted_run_plays_resumes_and_audits_on_postgres(tmp_path: Any, postgres_url: str) -> None:
    write(tmp_path, "s.yaml", "turns: []\n")
    agents = load_agents(write(tmp_path, "agents.yaml", "agents:\n  a: {model: scripted/s.yaml, tools: [calculate]}\n"))
    provider = ScriptedProvider(
        [{"tool_call": {"name": "calculate", "arguments": {"expression": "6*7"}}}, "42", "again"]
    )
    rt = Runtime(PostgresStore(postgres_url), providers=lambda spec, model: provider)
    result = rt.run_sync("a", "what is 6*7?", agents=agents)
    assert (result.status, result.output) == ("done", "42")
    events = rt.store.events(result.run_id)
    assert [e.kind for e in events] == [
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
    assert verify_chain(events) == []
    assert rt.store.get_run(result.run_id).status == "done"


def test_db_commands_migrate_report_and_copy_a_sqlite_history(
    tmp_path: Any, postgres_server: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = _fresh_database(postgres_server, "copied")
    status = json.loads(runner.invoke(app, ["db", "status", "--db-url", url, "--json"]).stdout)
    every = pg_migrations.names()  # the record's and harvest's
    assert (status["backend"], status["applied"], status["missing"]) == ("postgresql", [], every)
    dry = json.loads(runner.invoke(app, ["db", "migrate", "--db-url", url, "--dry-run", "--json"]).stdout)
    assert dry == {"dry_run": True, "would_apply": every}
    done = runner.invoke(app, ["db", "migrate", "--db-url", url])
    assert done.exit_code == 0 and f"applied {len(every)} migrations" in done.stdout
    assert json.loads(runner.invoke(app, ["db", "status", "--db-url", url, "--json"]).stdout)["missing"] == []

    # a single machine's history: two runs, one a fork of the other
    sqlite_path = tmp_path / "record.sqlite"
    write(tmp_path, "s.yaml", "turns: []\n")
    agents = load_agents(write(tmp_path, "agents.yaml", "agents:\n  a: {model: scripted/s.yaml}\n"))
    rt = Runtime(SQLiteStore(sqlite_path), providers=lambda spec, model: ScriptedProvider(["one", "two"]))
    first = rt.run_sync("a", "go", agents=agents)
    second = rt.run_sync("a", "again", agents=agents)
    rt.store.close()
    copied = runner.invoke(app, ["db", "copy", "--from", f"sqlite:{sqlite_path}", "--to", url, "--json"])
    assert copied.exit_code == 0, copied.output
    assert json.loads(copied.stdout) == {
        "runs": 2,
        "copied": 2,
        "skipped": 0,
        "events": len(SQLiteStore(sqlite_path).events(first.run_id)) * 2,
    }
    pg = PostgresStore(url)
    local = SQLiteStore(sqlite_path)
    for run_id in (first.run_id, second.run_id):
        theirs, ours = pg.events(run_id), local.events(run_id)
        assert [(e.seq, e.kind, e.ts, e.data, e.hash) for e in theirs] == [
            (e.seq, e.kind, e.ts, e.data, e.hash) for e in ours
        ]
        assert verify_chain(theirs) == []
    assert pg.append(first.run_id, "notice", {"after": "copy"}).seq == len(local.events(first.run_id)) + 1
    again = runner.invoke(app, ["db", "copy", "--from", f"sqlite:{sqlite_path}", "--to", url, "--json"])
    assert again.exit_code == 1 and "different record" in again.output  # the notice made them differ
    monkeypatch.setenv("LOOMRT_DB_URL", url)
    listed = json.loads(runner.invoke(app, ["runs", "list", "--json"]).stdout)
    assert {r["run_id"] for r in listed} == {first.run_id, second.run_id}
    verified = runner.invoke(app, ["runs", "verify", second.run_id, "--json"])
    assert json.loads(verified.stdout)["clean"] is True
    pg.close()
    local.close()


def test_a_worker_consolidates_the_harvest_queue_in_the_shared_database(postgres_url: str) -> None:
    import asyncio

    from loomrt.bench.harvest_load import bank_load, verify
    from loomrt.harvest import Consolidator
    from loomrt.harvest.scripted import echo_extractor
    from loomrt.harvest.wiring import release
    from loomrt.worker import work_once

    store = PostgresStore(postgres_url)
    texts = bank_load(store, 12, scopes=("user:alice", "user:bob"))
    rt = Runtime(store, owner="host-a/1/abc")
    consolidator = Consolidator(store, provider=echo_extractor(), embedder="hash", settle_s=0, holder=rt.owner)
    rows = asyncio.run(work_once(rt, consolidator=consolidator))
    (row,) = [r for r in rows if r["work"] == "consolidate"]
    assert row["done"] and row["spans"] == 12
    assert verify(store, texts)["lost"] == 0
    assert not [r for r in asyncio.run(work_once(rt, consolidator=consolidator)) if r["work"] == "consolidate"]
    release(store)
    store.close()
