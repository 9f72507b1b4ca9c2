"""Sabotage tests: each breaks the product the way a published figure exists to catch, runs
the measure at test size, and asserts that the figure comes out bad (DESIGN, principle 8).

A figure without one here is not published. docs/benchmarks.md names, next to each figure,
the sabotage it is known to catch.

| figure | sabotage | test |
|---|---|---|
| chat200 ``MODE/inject-only`` answered | injection made a no-op | ``test_inject_only_falls_to_no_recall_without_injection`` |
| ``runs verify`` on injected prompts | a recorded block's passage changed | ``test_recall_inject.py::test_verify_sees_a_prompt_whose_block_was_changed`` |
| harvest load "0 lost, 0 doubled" | the per-scope lease and the claim check both broken | ``test_harvest_load_counts_a_batch_two_workers_extracted`` |
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from loomrt.bench.core import BenchConfig
from loomrt.bench.runner import run_bench

INJECTED_MODES = ["recap/no-recall", "recap/inject-only"]


def _chat200(modes: list[str]) -> dict[str, Any]:
    result = run_bench(["chat200"], BenchConfig(quick=True, embedder="hash", modes=modes))
    return dict(result["workloads"]["chat200"]["modes"])


def test_inject_only_falls_to_no_recall_without_injection(monkeypatch: pytest.MonkeyPatch) -> None:
    honest = _chat200(INJECTED_MODES)
    assert honest["recap/inject-only"]["answered"] > honest["recap/no-recall"]["answered"] + 0.5

    async def nothing(run: Any) -> None:
        return None

    monkeypatch.setattr("loomrt.run.loop.inject_recall", nothing)
    broken = _chat200(INJECTED_MODES)
    assert broken["recap/inject-only"]["answered"] <= broken["recap/no-recall"]["answered"]


# ---------------------------------------------------------------- the harvest queue: "0 lost, 0 doubled"

_NO_EXCLUSION = '''
"""Sabotage for the harvest queue's figure: the per-scope lease and the claim check broken."""
import hashlib, json, time

from loomrt.harvest.queue import Queue
from loomrt.record.sqlite import SQLiteStore


def _take_lease(self, name, holder, ttl_s):
    return True


def _claim(self, scope, spans):
    ids = [s["id"] for s in spans]
    batch_id = hashlib.sha256(f"{scope}|{','.join(map(str, ids))}".encode()).hexdigest()[:16]
    with self.db.write() as conn:
        conn.execute(
            "INSERT INTO harvest_batches (batch_id, scope, span_ids, state, claimed_at) VALUES (?, ?, ?, 'claimed', ?) "
            "ON CONFLICT(batch_id) DO NOTHING",
            (batch_id, scope, json.dumps(ids), time.time()),
        )
        marks = ",".join("?" * len(ids))
        conn.execute(f"UPDATE harvest_spans SET state = 'claimed', batch_id = ? WHERE id IN ({marks})", [batch_id, *ids])
    return batch_id


SQLiteStore.take_lease = _take_lease
Queue.claim = _claim
'''


def _drained(tmp_path: Path, spans: int) -> dict[str, Any]:
    """The load measure at test size: ``spans`` spans (one a batch) drained by 2 worker processes."""
    from loomrt.bench.harvest_load import bank_load, drain, verify
    from loomrt.record.sqlite import SQLiteStore

    tmp_path.mkdir()
    db = tmp_path / "load.sqlite"
    SQLiteStore(db).close()
    texts = bank_load(db, spans)
    ran = drain(db, workers=2, batch_tokens=1)
    assert all(code == 0 for code in ran["exit_codes"]), ran["exit_codes"]
    return verify(db, texts, ran)


def test_harvest_load_counts_a_batch_two_workers_extracted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    honest = _drained(tmp_path / "honest", 24)
    assert honest["lost"] == 0 and honest["doubled"] == 0 and honest["lines_extracted"] == 24

    # the workers (other processes) import this at start-up: drain passes them the test's sys.path
    sabotage = tmp_path / "sabotage"
    sabotage.mkdir()
    (sabotage / "sitecustomize.py").write_text(_NO_EXCLUSION)
    monkeypatch.syspath_prepend(str(sabotage))
    broken = _drained(tmp_path / "broken", 24)
    assert broken["lost"] == 0 and broken["stored_twice"] == 0  # idempotent fact keys hide it from memory
    assert broken["doubled"] > 0 and broken["batches_doubled"] > 0, broken
