"""Sabotage tests: each breaks the product the way a published figure exists to catch, runs
the measure at test size, and asserts that the figure comes out bad (DESIGN, principle 8).

A figure without one here is not published. docs/benchmarks.md names, next to each figure,
the sabotage it is known to catch.

| figure | sabotage | test |
|---|---|---|
| chat200 ``MODE/inject-only`` answered | injection made a no-op | ``test_inject_only_falls_to_no_recall_without_injection`` |
| ``runs verify`` on injected prompts | a recorded block's passage changed | ``test_recall_inject.py::test_verify_sees_a_prompt_whose_block_was_changed`` |
"""

from __future__ import annotations

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
