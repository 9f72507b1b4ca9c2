"""The token ratio as a curve: over run length (50, 100, 200, 400 turns) and budget (4k, 8k, 32k).

A ratio at one run length says little: for a fixed budget, the longer the run, the more
append pays, so any distilling mode's ratio falls with length by arithmetic alone. The
curve shows that shape against both baselines: ``append`` (which could only run on an
unbounded window) and ``append/backstop`` (append that compacts in the model's window,
``window_tokens``: a baseline that could actually run). Beside each ratio: the share of
questions the scripted model answered right, so a ratio bought by forgetting shows.

The chat is the ``chat200`` script at each length (one fact per five turns, at most 60). Recall uses the
hash embedder here, whatever ``--embedder`` says: 30-odd runs with MiniLM would take most of
an hour on two cores, and the curve is about tokens.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from loomrt.bench.core import BenchConfig, ModeRun, Progress, standalone_measure

__all__ = ["LENGTHS", "BUDGETS", "CURVE_MODES", "curves"]

LENGTHS = [50, 100, 200, 400]
BUDGETS = [4096, 8192, 32768]
CURVE_MODES = ["append", "append/backstop", "recap", "compaction", "stateful"]


def _facts(turns: int) -> int:
    """One fact per five turns, at least 4 and at most 60 (the facts the generator has)."""
    return min(60, max(4, turns // 5))


def _point(runs: dict[str, ModeRun]) -> dict[str, Any]:
    def total(mode: str) -> int:
        return sum(c["input_tokens"] for c in runs[mode].calls)

    out: dict[str, Any] = {}
    for mode, run in runs.items():
        out[mode] = {
            "input_tokens": total(mode),
            "ratio": round(total(mode) / total("append"), 4),
            "ratio_backstop": round(total(mode) / total("append/backstop"), 4),
            "answered": round(sum(run.answered) / len(run.answered), 4) if run.answered else None,
            "status": "failed" if run.error else "done",
        }
    return out


@standalone_measure("curves", "the token ratio against run length (50-400 turns) and budget (4k-32k), both baselines")
def curves(config: BenchConfig, progress: Progress) -> dict[str, Any]:
    from loomrt.bench.workloads import play_chat

    lengths = [50, 100] if config.quick else LENGTHS
    budgets = [4096, 8192] if config.quick else BUDGETS
    base = dataclasses.replace(config, modes=list(CURVE_MODES), embedder="hash", quick=False)
    by_length: dict[str, Any] = {}
    for turns in lengths:
        result = play_chat(base, progress, turns=turns, facts=_facts(turns), label=f"curves {turns} turns")
        by_length[str(turns)] = _point(result.runs)
    middle = 100 if config.quick else 200
    by_budget: dict[str, Any] = {}
    for budget in budgets:
        if budget == config.budget_tokens and str(middle) in by_length:
            by_budget[str(budget)] = by_length[str(middle)]
            continue
        played = dataclasses.replace(base, budget_tokens=budget)
        result = play_chat(played, progress, turns=middle, facts=_facts(middle), label=f"curves {budget} budget")
        by_budget[str(budget)] = _point(result.runs)
    return {
        "budget_tokens": config.budget_tokens,
        "window_tokens": config.window_tokens,
        "turns_for_budgets": middle,
        "embedder": "hash",
        "by_length": by_length,
        "by_budget": by_budget,
    }
