"""A run's epoch only grows, whatever happens to its claim rows (issue 45 point 5): deleting
a claim (the obvious way to unstick a run) or rewriting its epoch never lets a stale writer
back in, and ``runs verify`` says what the record holds. The app role may not delete claims
on PostgreSQL; SQLite has the same monotonic guarantee through its triggers."""

from __future__ import annotations

import asyncio
import json
import sqlite3
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from conftest import app_login
from typer.testing import CliRunner

from loomrt import Runtime
from loomrt.cli.app import app
from loomrt.errors import FencedError
from loomrt.record.migrations import MIGRATIONS, migrate
from loomrt.record.sqlite import default_store
from loomrt.spec import AgentSpec
from loomrt.testing import ScriptedProvider


class _Admin:
    """Direct SQL on the record, as its superuser (PostgreSQL) or on the file (SQLite)."""

    def __init__(self, url: str):
        self.pg = url.startswith("postgresql")
        self.conn: Any = (
            psycopg.connect(url, autocommit=True)
            if self.pg
            else sqlite3.connect(url[len("sqlite:") :], isolation_level=None)
        )

    def run(self, sql: str, *args: Any) -> Any:
        return self.conn.execute(sql.replace("?", "%s") if self.pg else sql, args)

    def refused(self, sql: str, *args: Any) -> str:
        errors = (psycopg.Error,) if self.pg else (sqlite3.Error,)
        with pytest.raises(errors) as caught:
            self.run(sql, *args)
        return str(caught.value)


@pytest.fixture
def admin(shared_url: str) -> Iterator[_Admin]:
    a = _Admin(shared_url)
    yield a
    a.conn.close()


def _parked_run(url: str) -> str:
    rt = Runtime(default_store(url), providers=lambda s, m: ScriptedProvider(["hello"]))
    run = rt.start(AgentSpec(model="scripted/x"), interactive=True)
    asyncio.run(rt.send(run, "hi"))
    if rt.owner is not None and run.epoch is not None:
        rt.store.release_run(run.run_id, rt.owner, run.epoch)
    rt.store.close()
    return run.run_id


def test_a_deleted_claim_never_resets_the_epoch_and_the_stale_writer_stays_fenced(
    shared_url: str, admin: _Admin
) -> None:
    run_id = _parked_run(shared_url)
    store = default_store(shared_url)
    a = store.claim_run(run_id, "host-a/1/a", 60.0)
    store.append_many(run_id, [("notice", {"message": "a writes", "source": "test"})], epoch=a)
    admin.run("DELETE FROM run_owners WHERE run_id = ?", run_id)  # an operator "unsticks" the run
    assert "epoch" in admin.refused("DELETE FROM run_epochs WHERE run_id = ?", run_id)
    assert "epoch" in admin.refused("UPDATE run_epochs SET epoch = epoch - 1 WHERE run_id = ?", run_id)
    b = store.claim_run(run_id, "host-b/2/b", 60.0)
    assert b == a + 1  # not 1 again: above every epoch the run ever had
    with pytest.raises(FencedError, match=rf"claim \(epoch {a}\) is no longer the run's"):
        store.append_many(run_id, [("notice", {"message": "a, stale", "source": "test"})], epoch=a)
    store.append_many(run_id, [("notice", {"message": "b writes", "source": "test"})], epoch=b)
    admin.run("UPDATE run_owners SET owner = 'host-a/1/a', epoch = ? WHERE run_id = ?", a, run_id)  # rewritten
    with pytest.raises(FencedError):  # an epoch below the run's highest is refused, whatever the row says
        store.append_many(run_id, [("notice", {"message": "a, stale again", "source": "test"})], epoch=a)
    assert store.claim_run(run_id, "host-c/3/c", 1.0) == b + 1  # the rewritten row is not the newest claim
    notes = [e.data["message"] for e in store.events(run_id) if e.kind == "notice"]
    assert notes == ["a writes", "b writes"]
    written = len(store.events(run_id))
    store.close()
    verdict = CliRunner().invoke(app, ["--db-url", shared_url, "runs", "verify", run_id, "--json"])
    assert verdict.exit_code == 0, verdict.output
    report = json.loads(verdict.stdout)
    assert (report["clean"], report["problems"]) == (True, [])
    assert report["events"] == written


def test_an_old_record_keeps_its_epochs_through_the_migration(tmp_path: Any) -> None:
    path = tmp_path / "old.sqlite"
    conn = sqlite3.connect(path, isolation_level=None)
    migrate(conn, MIGRATIONS[:-1])  # a record from before run_epochs, with a claim at epoch 5
    conn.execute("INSERT INTO run_owners VALUES ('r', 'host-a/1/a', 5, 60, 0)")
    assert migrate(conn) == ["0011_run_epochs"]
    conn.execute("DELETE FROM run_owners")
    conn.close()
    store = default_store(f"sqlite:{path}")
    assert store.claim_run("r", "host-b/2/b", 60.0) == 6
    store.close()


def test_the_app_role_may_claim_renew_and_release_but_never_delete_a_claim(postgres_url: str) -> None:
    as_app = app_login(postgres_url, "epoch_login")
    run_id = _parked_run(as_app)
    store = default_store(as_app)
    epoch = store.claim_run(run_id, "host-a/1/a", 60.0)
    assert store.renew_run(run_id, "host-a/1/a", epoch, 60.0)
    store.append_many(run_id, [("notice", {"message": "a", "source": "test"})], epoch=epoch)
    store.release_run(run_id, "host-a/1/a", epoch)
    with psycopg.connect(as_app, autocommit=True) as conn:
        for sql in ("DELETE FROM run_owners", "TRUNCATE run_owners", "DELETE FROM run_epochs", "TRUNCATE run_epochs"):
            with pytest.raises(psycopg.errors.InsufficientPrivilege, match="permission denied|refused"):
                conn.execute(sql)
    with psycopg.connect(postgres_url, autocommit=True) as owner:  # the trigger holds for a superuser too
        with pytest.raises(psycopg.Error, match="epoch only grows: TRUNCATE is refused"):
            owner.execute("TRUNCATE run_epochs")
        (kept,) = owner.execute("SELECT epoch FROM run_epochs WHERE run_id = %s", (run_id,)).fetchone()
    assert kept == epoch
    assert json.loads(json.dumps(store.run_owners(expired=True)))[0]["epoch"] == epoch
    store.close()
