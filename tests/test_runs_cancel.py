"""`loomrt runs cancel RUN_ID`: a detached run stopped from the command line, through the same
path as MCP `cancel_run` (`Runtime.cancel`): queued (never played), or played by a worker
process (it stops at its next step, the model's late answer not played), on both backends;
an unknown or ended run is one clear error."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from owners_kit import kinds
from spine_kit import write
from typer.testing import CliRunner

from loomrt.cli import app
from loomrt.record.sqlite import default_store

pytestmark = pytest.mark.slow  # worker processes
runner = CliRunner()


def _detach(url: str, folder: Path, delay_s: float) -> str:
    write(folder, "s.yaml", f"turns:\n  - {{text: the late answer, delay_s: {delay_s}}}\n")
    agents = write(folder, "agents.yaml", "agents:\n  a: {model: scripted/s.yaml}\n")
    done = runner.invoke(app, ["--db-url", url, "run", "a", "go", "--agents", str(agents), "--detach", "--json"])
    assert done.exit_code == 0, done.output
    return str(json.loads(done.stdout)["run_id"])


def test_a_queued_run_cancelled_is_never_played(shared_url: str, tmp_path: Path) -> None:
    run_id = _detach(shared_url, tmp_path, 0)
    done = runner.invoke(app, ["--db-url", shared_url, "runs", "cancel", run_id, "--json"])
    assert done.exit_code == 0, done.output
    assert json.loads(done.stdout)["status"] == "cancelled"
    worker = runner.invoke(app, ["--db-url", shared_url, "worker", "--once", "--json"])
    assert worker.stdout.strip() == ""  # nothing queued any more
    assert kinds(shared_url, run_id)[-1] == "cancelled"
    again = runner.invoke(app, ["--db-url", shared_url, "runs", "cancel", run_id])
    assert again.exit_code == 2 and f"run {run_id} has already ended (cancelled)" in again.output


def test_a_run_a_worker_plays_stops_at_its_next_step(shared_url: str, tmp_path: Path) -> None:
    run_id = _detach(shared_url, tmp_path, 4)
    worker = subprocess.Popen(
        [sys.executable, "-m", "loomrt", "worker", "--json", "--interval", "1"],
        env={**os.environ, "LOOMRT_DB_URL": shared_url},
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        end = time.monotonic() + 60
        while "resumed" not in kinds(shared_url, run_id):  # taken: its model is thinking
            assert time.monotonic() < end
            time.sleep(0.1)
        done = runner.invoke(app, ["--db-url", shared_url, "runs", "cancel", run_id])
        assert done.exit_code == 0 and done.stdout.strip() == f"run {run_id}: cancelled", done.output
        assert worker.stdout is not None
        row = json.loads(worker.stdout.readline())  # the worker's run ends as the model answers
        assert (row["run_id"], row["status"]) == (run_id, "cancelled"), row
    finally:
        worker.send_signal(signal.SIGTERM)
        worker.communicate(timeout=60)
    written = kinds(shared_url, run_id)
    assert written.count("cancelled") == 1 and "final" not in written and "assistant_message" not in written, written
    store = default_store(shared_url)
    assert store.get_run(run_id).status == "cancelled" and store.run_owners() == []
    store.close()
    verdict = runner.invoke(app, ["--db-url", shared_url, "runs", "verify", run_id, "--json"])
    assert json.loads(verdict.stdout)["clean"], verdict.stdout


def test_an_unknown_or_finished_run_is_one_clear_error(tmp_path: Path) -> None:
    url = f"sqlite:{tmp_path / 'record.sqlite'}"
    unknown = runner.invoke(app, ["--db-url", url, "runs", "cancel", "nosuchrun"])
    assert unknown.exit_code == 2 and "no run 'nosuchrun'" in unknown.output and "runs list" in unknown.output
    run_id = _detach(url, tmp_path, 0)
    runner.invoke(app, ["--db-url", url, "worker", "--once"])
    ended = runner.invoke(app, ["--db-url", url, "runs", "cancel", run_id, "--json"])
    assert ended.exit_code == 2 and f"run {run_id} has already ended (done)" in ended.output
    assert "Traceback" not in ended.output


def test_a_foreground_run_is_not_cancelled_from_elsewhere_unless_forced(tmp_path: Path) -> None:
    """A foreground `loomrt run` claims nothing and looks for no cancel: `runs cancel` says so
    instead of recording a cancel the run would play on after (it wrote `final` after it)."""
    url = f"sqlite:{tmp_path / 'record.sqlite'}"
    write(tmp_path, "s.yaml", "turns:\n  - {text: the late answer, delay_s: 30}\n")
    agents = write(tmp_path, "agents.yaml", "agents:\n  a: {model: scripted/s.yaml}\n")
    playing = subprocess.Popen(
        [sys.executable, "-m", "loomrt", "--db-url", url, "run", "a", "go", "--agents", str(agents), "--json"],
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        end = time.monotonic() + 60
        while not (tmp_path / "record.sqlite").exists() or "user_input" not in kinds(url, _only_run(url)):
            assert time.monotonic() < end and playing.poll() is None
            time.sleep(0.2)
        run_id = _only_run(url)
        refused = runner.invoke(app, ["--db-url", url, "runs", "cancel", run_id])
        assert refused.exit_code == 2 and "no worker claims it" in refused.output and "--force" in refused.output
        assert "cancelled" not in kinds(url, run_id)
    finally:
        playing.kill()
        playing.communicate(timeout=60)
    forced = runner.invoke(app, ["--db-url", url, "runs", "cancel", run_id, "--force", "--json"])
    assert forced.exit_code == 0 and json.loads(forced.stdout)["status"] == "cancelled", forced.output


def _only_run(url: str) -> str:
    store = default_store(url)
    try:
        runs = store.list_runs()
        return runs[0].run_id if runs else ""
    finally:
        store.close()
