"""The figures of ``loomrt bench harvest``'s LoCoMo measure: per-tier tallies of questions
found at each k (overall and by category), the accuracy-against-tokens curve (the share of
questions whose answer the retrieved text states, at context budgets of 250 to 2,000 tokens)
and the totals over every conversation's record."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

from loomrt.bench.locomo_recall import CATEGORY_NAMES
from loomrt.bench.tally import Tally, within

__all__ = ["Tally", "TIERS", "BUDGETS", "BUDGET_TIERS", "within", "locomo_totals"]


TIERS = ("memory_states", "memory_cites", "raw_states", "raw_evidence", "passage_states", "fused_states")
"""The tallies a LoCoMo conversation's record keeps (figures with counts by category): the facts
tier's states and cites, the raw turns', and the passage tier's and the fused tier's states."""


BUDGETS = (250, 500, 1000, 2000)
"""Context budgets, in tokens of retrieved text, of the accuracy-against-tokens curve."""
BUDGET_TIERS: dict[str, tuple[str, ...]] = {
    "facts": ("facts",),
    "passages": ("passages",),
    "fused": ("facts", "passages"),
}
"""The memory tiers the curve is measured for (search ``tiers``)."""


def locomo_totals(records: dict[str, dict[str, Any]], of: Sequence[str], ks: Sequence[int]) -> dict[str, Any]:
    """The LoCoMo figures over every conversation's record so far (``of`` names all the chosen
    ones). A record may cover several conversations (``covers``): one measured as a group."""
    tiers = {name: Tally(ks) for name in TIERS}
    out: dict[str, Any] = {
        "conversations": [],
        "of_conversations": list(of),
        "turns": 0,
        "spans": 0,
        "facts": 0,
        "passages": 0,
        "dead_letters": 0,
        "retries": 0,
        "dropped": {},
        "writes": {},
        "seconds": 0.0,
        "per_conversation": records,
    }
    for key, rec in records.items():
        out["conversations"] += rec.get("covers", [key])
        for name in ("turns", "spans", "facts", "dead_letters", "retries"):
            out[name] += rec[name]
        out["passages"] += rec.get("passages", 0)
        out["seconds"] = round(out["seconds"] + rec["seconds"], 1)
        for name in ("dropped", "writes"):
            out[name] = dict(Counter(out[name]) + Counter(rec.get(name, {})))
        for name, figures in rec["tallies"].items():
            tiers[name].add_figures(figures)
        out["part_tokens"] = rec.get("part_tokens")
        out["sample_facts"] = rec.get("sample_facts", [])
    out["rejected"] = out["dropped"].get("unverified", 0)  # facts with a value their lines do not hold
    out["repeats"] = out["dropped"].get("repeated", 0)  # statements a reply had already made
    out["spans_per_min"] = round(out["spans"] / out["seconds"] * 60, 2) if out["seconds"] else None
    out["turns_per_min"] = round(out["turns"] / out["seconds"] * 60, 1) if out["seconds"] else None
    out["memory"] = {
        "states": tiers["memory_states"].figures(CATEGORY_NAMES),
        "cites": tiers["memory_cites"].figures(CATEGORY_NAMES),
    }
    if all("budgets" in rec for rec in records.values()):  # the accuracy-against-tokens curve
        names = [*BUDGET_TIERS]
        if all("raw" in rec["budgets"] for rec in records.values()):  # raw turns (bench recall's index)
            names.append("raw")
        curves = {name: Tally(BUDGETS) for name in names}
        for rec in records.values():
            for name in names:
                curves[name].add_figures(rec["budgets"][name])
        out["budgets"] = {name: curve.figures(CATEGORY_NAMES) for name, curve in curves.items()}
        if "raw" in curves:  # the goal: the fused memory tier at or above raw turns at every budget
            fused, raw = out["budgets"]["fused"]["recall_at"], out["budgets"]["raw"]["recall_at"]
            out["fused_at_or_above_raw"] = {b: fused[b] >= raw[b] for b in raw}
    if all("fused_states" in rec["tallies"] for rec in records.values()):  # (records from before the tier: none)
        out["tiers"] = {
            "passages": tiers["passage_states"].figures(CATEGORY_NAMES),
            "fused": tiers["fused_states"].figures(CATEGORY_NAMES),
        }
    if all("raw_states" in rec["tallies"] for rec in records.values()):
        out["raw"] = {
            "evidence": tiers["raw_evidence"].figures(CATEGORY_NAMES),
            "states": tiers["raw_states"].figures(CATEGORY_NAMES),
        }
    return out
