"""The QA benchmark's figures per configuration, from its answers."""

from __future__ import annotations

import statistics
from typing import Any

__all__ = ["summarize", "CATEGORY_NAMES"]

CATEGORY_NAMES = {1: "multi-hop", 2: "temporal", 3: "open-domain", 4: "single-hop", 5: "adversarial"}


def _mean(xs: list[float]) -> float | None:
    return round(statistics.fmean(xs), 4) if xs else None


def _misses(rows: list[dict[str, Any]]) -> dict[str, int]:
    """Why answers were wrong (not contained, categories 1-4), from where the gold answer was,
    word for word: in the context the question met; Recall not called; called and the
    results did not hold it; called, held, and still answered wrongly. Gold answers that no
    text holds verbatim (a date the conversation gives relatively, a paraphrase) count as
    ``not verbatim anywhere``."""
    out = {
        "in context, answered wrongly": 0,
        "not in context, Recall not called": 0,
        "Recall called, results missed it": 0,
        "Recall found it, answered wrongly": 0,
        "injected, answered wrongly": 0,
        "not verbatim anywhere": 0,
    }
    for r in rows:
        if r["category"] == 5 or r["contains"]:
            continue
        in_context, in_recall = r.get("gold_in_context"), r.get("gold_in_recall")
        if in_context:
            out["in context, answered wrongly"] += 1
        elif r.get("gold_in_injected"):
            out["injected, answered wrongly"] += 1
        elif in_recall:
            out["Recall found it, answered wrongly"] += 1
        elif r["recall_calls"] and in_recall is False:
            out["Recall called, results missed it"] += 1
        elif not r["recall_calls"] and in_context is False and r["config"].partition("/")[0] not in ("full", "recall"):
            out["not in context, Recall not called"] += 1
        else:
            out["not verbatim anywhere"] += 1
    return out


def summarize(
    rows: list[dict[str, Any]], setups: dict[str, dict[str, Any]], sizes: dict[str, int], configs: list[str]
) -> dict[str, Any]:
    """Per configuration: accuracy (F1, contains, judge), per category, and cost.

    Cost per question amortises the configuration's replay (its distillation calls) over
    the questions it answered in that conversation: each configuration bears its whole
    replay, even where ``MODE`` and ``MODE/no-recall`` share one. The folded size is the
    largest prompt of the answering calls (estimated tokens, Recall results included)
    over the conversation's estimated tokens.
    """
    out: dict[str, Any] = {}
    for config in configs:
        mine = [r for r in rows if r["config"] == config]
        if not mine:
            skipped = [s.get("skipped") for k, s in setups.items() if k.endswith(f":{config}") and "skipped" in s]
            out[config] = {"questions": 0, "skipped": skipped[0] if skipped else "no answers"}
            continue
        per_conv: dict[str, int] = {}
        for r in mine:
            per_conv[r["conversation"]] = per_conv.get(r["conversation"], 0) + 1
        input_tokens, seconds, folded = [], [], []
        for r in mine:
            setup = setups.get(f"{r['conversation']}:{config}") or {}
            n = per_conv[r["conversation"]]
            input_tokens.append(r["input_tokens"] + setup.get("distil_input_tokens", 0) / n)
            seconds.append(r["seconds"] + setup.get("seconds", 0) / n)
            folded.append(r["largest_prompt_estimate"] / max(1, sizes.get(r["conversation"], 1)))
        categories: dict[str, Any] = {}
        for c in sorted({r["category"] for r in mine}):
            rc = [r for r in mine if r["category"] == c]
            categories[str(c)] = {
                "name": CATEGORY_NAMES.get(c, str(c)),
                "questions": len(rc),
                "f1": _mean([r["f1"] for r in rc]),
                "contains": _mean([float(r["contains"]) for r in rc]),
            }
        judged = [float(r["judge"]) for r in mine if r.get("judge") is not None]
        out[config] = {
            "questions": len(mine),
            "f1": _mean([r["f1"] for r in mine]),
            "contains": _mean([float(r["contains"]) for r in mine]),
            "judge": _mean(judged),
            "by_category": categories,
            "folded_size": _mean(folded),
            "input_tokens_per_question": round(statistics.fmean(input_tokens)),
            "seconds_per_question": round(statistics.fmean(seconds), 2),
            "recall_calls_per_question": _mean([float(r["recall_calls"]) for r in mine]),
            "failed": sum(r["status"] != "done" for r in mine),
            "misses": _misses(mine),
            "abstained": sum("no information available" in r["answer"].lower() for r in mine),
        }
        if any("injected_none" in r for r in mine):
            answerable = [r for r in mine if "evidence_injected" in r and r["category"] != 5]
            out[config]["evidence_injected"] = _mean([float(r["evidence_injected"]) for r in answerable])
            out[config]["injected_none"] = _mean([float(bool(r.get("injected_none"))) for r in mine])
    return out
