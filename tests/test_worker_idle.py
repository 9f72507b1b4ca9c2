"""An idle worker's look at the queue costs a constant number of queries, however many runs
were ever played (issue 45 point 7: it was one query per run ever played), and still finds
the run a dead worker left. Counted on the record's own SQLite connection."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from loomrt import Runtime
from loomrt.record.sqlite import default_store
from loomrt.spec import AgentSpec
from loomrt.testing import ScriptedProvider
from loomrt.worker import work_once


def _idle_queries(rt: Runtime) -> int:
    """The statements one idle ``work_once`` runs on the record."""
    statements: list[str] = []
    rt.store._conn.set_trace_callback(statements.append)  # type: ignore[attr-defined]
    try:
        assert asyncio.run(work_once(rt)) == []
    finally:
        rt.store._conn.set_trace_callback(None)  # type: ignore[attr-defined]
    return len(statements)


def _played(rt: Runtime, n: int) -> None:
    """``n`` runs played to the end by this worker (each leaves its let-go claim behind)."""
    for _ in range(n):
        assert rt.run_sync(AgentSpec(model="scripted/x"), "hi").status == "done"


@pytest.mark.slow
def test_an_idle_look_costs_the_same_after_five_runs_or_forty(tmp_path: Path) -> None:
    rt = Runtime(
        default_store(f"sqlite:{tmp_path / 'record.sqlite'}"),
        owner="host/1/0123456789abcdef",
        providers=lambda s, m: ScriptedProvider(["ok"] * 100),
    )
    _played(rt, 5)
    few = _idle_queries(rt)
    _played(rt, 35)
    assert len(rt.store.run_owners(expired=True)) == 40  # every run played left a claim row
    assert _idle_queries(rt) == few <= 8, few
    run = rt.start(AgentSpec(model="scripted/x"))  # a run whose worker died mid-turn ...
    rt.store.release_run(run.run_id, "host/1/0123456789abcdef", run.epoch or 0)
    rt.store.claim_run(run.run_id, "elsewhere/2/fedcba9876543210", 0.0)  # ... its claim lapsed
    time.sleep(0.01)  # (SQLite's clock reads whole milliseconds)
    assert rt.store.stalled_runs() == [rt.store.get_run(run.run_id)]
    rows = asyncio.run(work_once(rt))
    assert [(r["run_id"], r["work"], r["done"]) for r in rows] == [(run.run_id, "resume", True)]
    rt.store.close()
