"""`loomrt workers list`: each worker's liveness, the runs it plays now and its heartbeat's
age, read from the claims the record holds (issue 46), on both backends."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from owners_kit import crashed_worker
from typer.testing import CliRunner

from loomrt.cli.app import app
from loomrt.record.sqlite import default_store
from loomrt.runtime import Runtime
from loomrt.spec import AgentSpec
from loomrt.testing import ScriptedProvider
from loomrt.worker import detach, take


@pytest.fixture(params=["sqlite", "postgres"])
def url(request: pytest.FixtureRequest, tmp_path: Any) -> str:
    if request.param == "sqlite":
        return f"sqlite:{tmp_path / 'record.sqlite'}"
    return str(request.getfixturevalue("postgres_url"))


def _runs(url: str, n: int) -> list[str]:
    rt = Runtime(default_store(url), providers=lambda spec, model: ScriptedProvider(["ok"] * n))
    spec = AgentSpec.model_validate({"model": "scripted/none.yaml"})
    ids = [rt.run_sync(spec, "hello", name="helper").run_id for _ in range(n)]
    rt.store.close()
    return ids


def test_live_lapsed_and_released_claims(url: str) -> None:
    GONE = crashed_worker()  # a worker of this machine that ended without letting go
    playing, lapsed, released = _runs(url, 3)
    store = default_store(url)
    try:
        store.claim_run(playing, "far-host/12/abc123", 900.0)
        store.claim_run(lapsed, GONE, 0.05)
        epoch = store.claim_run(released, "far-host/12/abc123", 900.0)
        store.release_run(released, "far-host/12/abc123", epoch)
        time.sleep(0.3)
    finally:
        store.close()
    result = CliRunner().invoke(app, ["--db-url", url, "workers", "list", "--json"])
    assert result.exit_code == 0, result.output
    workers = {w["worker"]: w for w in json.loads(result.stdout)["workers"]}
    assert set(workers) == {"far-host/12/abc123", GONE}
    far, gone = workers["far-host/12/abc123"], workers[GONE]
    assert (far["live"], far["process"]) == (True, "elsewhere")
    assert [r["run_id"] for r in far["runs"]] == [playing]  # the released claim is nobody's job
    run = far["runs"][0]
    assert (run["agent"], run["status"], run["lapsed"]) == ("helper", "done", False) and run["epoch"] >= 1
    assert 0 <= run["heartbeat_age_s"] < 30 and 800 < run["expires_in_s"] <= 900
    assert (gone["live"], gone["process"]) == (False, "gone")
    assert gone["runs"][0]["run_id"] == lapsed and gone["runs"][0]["lapsed"]
    text = CliRunner().invoke(app, ["--db-url", url, "workers", "list"]).output
    assert "far-host/12/abc123  live (process: elsewhere)" in text
    assert f"plays run {lapsed} (helper, done): claim lapsed" in text and "not live (process: gone)" in text


def test_the_queue_block_counts_what_waits_how_long_it_waited_and_the_retries(url: str) -> None:
    import asyncio

    from loomrt.queue_metrics import queue_metrics

    store = default_store(url)
    rt = Runtime(store, providers=lambda spec, model: ScriptedProvider(["ok"] * 4))
    spec = AgentSpec.model_validate({"model": "scripted/none.yaml"})

    async def detach_two() -> list[str]:
        return [(await detach(rt, spec, f"job {i}", name="helper")).run_id for i in range(2)]

    try:
        first, second = asyncio.run(detach_two())
        time.sleep(0.3)
        before = queue_metrics(store)
        assert (before["runs_queued"], before["taken"], before["latency_s_median"]) == (2, 0, None)
        assert before["oldest_queued_s"] >= 0.3
        assert asyncio.run(take(rt, first)) is not None  # a worker takes one
        after = queue_metrics(store)
        assert (after["runs_queued"], after["taken"], after["retries"]) == (1, 1, 0)
        assert after["latency_s_median"] >= 0.3  # it waited in the queue that long
        store.append(first, "resumed", {"from_seq": store.get_run(first).last_seq})  # as a worker's resume records it
        assert queue_metrics(store)["retries"] == 1
    finally:
        store.close()
    result = CliRunner().invoke(app, ["--db-url", url, "workers", "list", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["queue"]["runs_queued"] == 1
    text = CliRunner().invoke(app, ["--db-url", url, "workers", "list"]).output
    assert (
        "queue: 1 run waiting (the oldest for" in text
        and "queued to taken (1 run of the 200 newest)" in text
        and "1 retry" in text
    )
