"""`loomrt run --detach` and `loomrt worker`: queued runs played by any worker, each once,
with real separate worker processes on one record (SQLite file, PostgreSQL database)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from spine_kit import write
from typer.testing import CliRunner

from loomrt.cli import app
from loomrt.record.sqlite import default_store

runner = CliRunner()


@pytest.fixture(params=["sqlite", "postgres"])
def shared_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:{tmp_path / 'record.sqlite'}"
    return str(request.getfixturevalue("postgres_url"))


def _agents(folder: Path, turns: int = 40) -> Path:
    write(folder, "s.yaml", "turns:\n" + "".join(f"  - {{text: answer {i}}}\n" for i in range(turns)))
    return write(folder, "agents.yaml", "agents:\n  a: {model: scripted/s.yaml}\n")


def _detach(url: str, agents: Path, prompt: str) -> str:
    done = runner.invoke(app, ["--db-url", url, "run", "a", prompt, "--agents", str(agents), "--detach", "--json"])
    assert done.exit_code == 0, done.output
    out = json.loads(done.stdout)
    assert out["status"] == "queued"
    return str(out["run_id"])


def _worker(url: str, *args: str) -> subprocess.Popen[str]:
    env = {**os.environ, "LOOMRT_DB_URL": url}
    return subprocess.Popen(
        [sys.executable, "-m", "loomrt", "worker", "--json", *args],
        env=env,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


def test_a_detached_run_waits_queued_and_a_worker_plays_it(shared_url: str, tmp_path: Path) -> None:
    agents = _agents(tmp_path)
    run_id = _detach(shared_url, agents, "hello")
    store = default_store(shared_url)
    assert store.get_run(run_id).status == "queued" and store.run_owners() == []  # nobody has it yet
    done = runner.invoke(app, ["--db-url", shared_url, "worker", "--once", "--json"])
    rows = [json.loads(line) for line in done.stdout.splitlines()]
    assert rows == [{"run_id": run_id, "work": "play", "done": True, "status": "done", "reason": None}]
    assert store.get_run(run_id).status == "done"
    assert [e.kind for e in store.events(run_id)][-3:] == ["model_call", "assistant_message", "final"]
    again = runner.invoke(app, ["--db-url", shared_url, "worker", "--once", "--json"])
    assert again.stdout.strip() == ""  # played once: nothing queued any more
    store.close()


def test_two_worker_processes_play_every_queued_run_exactly_once(shared_url: str, tmp_path: Path) -> None:
    agents = _agents(tmp_path)
    queued = [_detach(shared_url, agents, f"task {i}") for i in range(6)]
    workers = [_worker(shared_url, "--once", "--concurrency", "2") for _ in range(2)]
    outs = [w.communicate(timeout=240) for w in workers]
    assert all(w.returncode == 0 for w in workers), [e for _, e in outs]
    rows = [json.loads(line) for o, _ in outs for line in o.splitlines() if line.strip()]
    played = [r["run_id"] for r in rows if r["done"]]
    assert sorted(played) == sorted(queued)  # each by exactly one worker
    refused = [r for r in rows if not r["done"]]
    assert all(r["reason"] == "another worker has it" for r in refused), refused
    store = default_store(shared_url)
    for run_id in queued:
        kinds = [e.kind for e in store.events(run_id)]
        assert (kinds.count("resumed"), kinds.count("final"), store.get_run(run_id).status) == (1, 1, "done"), kinds
    store.close()


def test_on_postgres_an_idle_worker_is_woken_by_the_detached_runs_notify(postgres_url: str, tmp_path: Path) -> None:
    agents = _agents(tmp_path)
    worker = _worker(postgres_url, "--interval", "60")  # it would look again only after a minute
    try:
        time.sleep(6)  # it has looked once, found nothing, and is listening
        started = time.monotonic()
        run_id = _detach(postgres_url, agents, "wake up")
        line = worker.stdout.readline() if worker.stdout else ""  # type: ignore[union-attr]
        waited = time.monotonic() - started
        assert json.loads(line)["run_id"] == run_id and waited < 30, (line, waited)
    finally:
        worker.kill()
        worker.communicate()


def test_workers_list_shows_nothing_when_nobody_plays(shared_url: str) -> None:
    listed: Any = runner.invoke(app, ["--db-url", shared_url, "workers", "list", "--json"])
    assert listed.exit_code == 0 and json.loads(listed.stdout)["workers"] == []


def test_a_worker_killed_mid_run_leaves_it_to_the_next_worker_which_resumes_it(shared_url: str, tmp_path: Path) -> None:
    agents = _agents(tmp_path)
    run_id = _detach(shared_url, agents, "survive this")
    doomed = subprocess.run(
        [sys.executable, "-m", "loomrt", "worker", "--once", "--json"],
        text=True,
        capture_output=True,
        timeout=120,
        env={**os.environ, "LOOMRT_DB_URL": shared_url, "LOOMRT_CRASH_AT": "model_answered:1"},
    )
    assert doomed.returncode == -9  # SIGKILLed itself as the model answered: mid-turn, the claim held
    store = default_store(shared_url)
    assert store.get_run(run_id).status == "active"
    (dead,) = store.run_owners()  # its lease has time left, but its process is gone
    rescued = runner.invoke(app, ["--db-url", shared_url, "worker", "--once", "--json"])
    rows = [json.loads(line) for line in rescued.stdout.splitlines()]
    assert rows == [{"run_id": run_id, "work": "resume", "done": True, "status": "done", "reason": None}]
    kinds = [e.kind for e in store.events(run_id)]
    assert kinds.count("final") == 1 and kinds.count("resumed") == 2  # taken, died, taken again
    assert store.run_owners() == []  # the run ended: its claim is let go
    (claim,) = [c for c in store.run_owners(expired=True) if c["run_id"] == run_id]
    assert claim["epoch"] == dead["epoch"] + 1 and claim["owner"] != dead["owner"]  # the new claim fenced the dead one
    store.close()
