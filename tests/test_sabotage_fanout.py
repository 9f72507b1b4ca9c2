"""Sabotage test for the fanout measure's "Σ rows do not grow with H" (DESIGN, principle 8);
apart from tests/test_sabotage.py only while that file had other uncommitted work.

| figure | sabotage | test |
|---|---|---|
| fanout "Σ rows do not grow with H" (the ledger child) | no Σ budget (``state_max_tokens`` never enforced) | ``test_fanout_sees_ledger_rows_grow_without_the_sigma_budget`` |
"""

from __future__ import annotations

import pytest


def test_fanout_sees_ledger_rows_grow_without_the_sigma_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    from loomrt.bench.fanout import LEDGER_SIGMA_TOKENS, fanout_figures

    honest = fanout_figures((1,), (20, 60))["ledger"]
    assert honest["within_budget"] and honest["growth"] <= 1.1, honest

    monkeypatch.setattr("loomrt.run.reducers.stateful.state_share", lambda run: 10**9)  # no Σ budget
    broken = fanout_figures((1,), (20, 60))
    rows = {r["horizon"]: r for r in broken["rows"]}
    assert rows[60]["state_row_tokens"] == rows[20]["state_row_tokens"]  # the overwriting Σ cannot show it
    assert not broken["ledger"]["within_budget"] and broken["ledger"]["growth"] >= 2, broken["ledger"]
    assert rows[60]["ledger_row_tokens"] > 2 * LEDGER_SIGMA_TOKENS
