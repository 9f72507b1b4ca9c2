"""The ``fanout`` measure: what N children cost their parent, Σ rows against transcripts.

A parent calls one fan-out of N stateful children, each working H steps (a tool call per
step) before it ends with its final Σ; then the parent answers. Two ways to hand the
results up, on the same children and scripts:

- **state**: loomrt's ``parallel_spawn``: one row per child carrying its final Σ;
- **transcript**: what a runtime without stateful hand-up does: the same children, run
  concurrently, and each child's whole message log returned to the parent.

Two child kinds hand up Σ rows. The **overwriting** child's Σ is ``{step, finding}``, and each
step overwrites it: its row cannot grow with H whatever the runtime does. The **ledger** child's
Σ accumulates: each step appends a finding to ``findings``, so only the Σ budget
(``context.stateful.state_max_tokens``, :data:`LEDGER_SIGMA_TOKENS` here) keeps its row
bounded: a patch over the budget is rejected, and the child (a model that reads its Σ and
the rejection, as a real one would) drops its oldest findings to fit.

Reported per (N, H): the parent's working context after the fan-out (tokens), and the total
input tokens of the parent and all children (a run's cost); the largest Σ row a child
handed up, of each kind (tokens); the parent's context with N ledger children. The parent's
window and message limit are set out of reach, so no variant is cut: loomrt would otherwise
cut a transcript at ``context.message_max_tokens`` (a quarter of the budget), which hides its
size. The design fails if the ledger rows grow with H (past the Σ budget), or if Σ rows cost
about what transcripts cost.
"""

from __future__ import annotations

import asyncio
import json
import re
import tempfile
from pathlib import Path
from typing import Any

from loomrt.bench.core import BenchConfig, Progress, standalone_measure

__all__ = ["fanout_figures", "fanout", "LEDGER_SIGMA_TOKENS"]

SCHEMA = {"type": "object", "properties": {"step": {"type": "integer"}, "finding": {"type": "string"}}}
LEDGER_SCHEMA = {
    "type": "object",
    "properties": {"step": {"type": "integer"}, "findings": {"type": "array", "items": {"type": "string"}}},
}
LEDGER_SIGMA_TOKENS = 200
"""The ledger child's Σ budget (``context.stateful.state_max_tokens``): about 12 findings."""
LEDGER = "bench/ledger"
"""The ledger child's model: :func:`_ledger_reply`, answered by a function provider."""
_OVER = re.compile(r"the patched state would be (\d+) tokens, over its share of the budget \((\d+) tokens")


def _ledger_reply(horizon: int) -> Any:
    """The ledger child's model: each step appends a finding to Σ's ``findings`` and reads a
    gauge; told its patch is over the Σ budget, it keeps only the newest findings that the
    rejection's figures say will fit; after ``horizon`` steps it is done."""
    from loomrt.messages import ToolCall
    from loomrt.providers.base import ModelRequest, ModelResponse, Usage
    from loomrt.tokens import count_dicts

    def reply(request: ModelRequest) -> ModelResponse:
        said = [str(m.get("content") or "") for m in request.messages]
        sigma: dict[str, Any] = next(
            (json.loads(t.split("\n", 1)[1]) for t in reversed(said) if t.startswith("Your state Σ:")), {}
        )
        step = int(sigma.get("step", 0))
        if step >= horizon:
            args: dict[str, Any] = {"reasoning": "Done.", "patch": {}, "done": True, "final": "readings logged"}
        else:
            findings = [*sigma.get("findings", []), f"gauge {step}: {step * 3 + 7} units, within its limits"]
            over = _OVER.search(said[-1]) if said else None
            if over:  # keep the newest findings, in proportion to what fits, with a margin
                size, share = int(over.group(1)), int(over.group(2))
                findings = findings[len(findings) - max(1, len(findings) * share // size - 1) :]
            args = {
                "reasoning": f"Step {step}: read gauge {step}.",
                "patch": {"step": step + 1, "findings": findings},
                "action": {"tool": "calculate", "arguments": {"expression": f"{step} * 3 + 7"}},
            }
        call = ToolCall(id=f"call_{step}_{len(said)}", name="emit_state", arguments=args)
        return ModelResponse(
            tool_calls=(call,),
            usage=Usage(count_dicts(request.messages), max(1, len(json.dumps(args)) // 4)),
            model=LEDGER,
            finish_reason="tool_calls",
        )

    return reply


def _scripts(folder: Path, n: int, horizon: int) -> None:
    turns: list[dict[str, Any]] = [
        {
            "emit_state": {
                "reasoning": f"Step {i}: check reading {i}.",
                "patch": {"step": i + 1},
                "action": {"tool": "calculate", "arguments": {"expression": f"{i} * 3 + 7"}},
            }
        }
        for i in range(horizon)
    ]
    turns.append(
        {
            "emit_state": {
                "reasoning": "Done.",
                "patch": {"finding": "readings within limits"},
                "done": True,
                "final": "readings within limits",
            }
        }
    )
    (folder / "child.yaml").write_text(json.dumps({"turns": turns, "summaries": [{"extractive": 300}]}))
    for script, tool, child in (
        ("parallel_spawn", "parallel_spawn", "child"),
        ("parallel_spawn_transcripts", "parallel_spawn_transcripts", "child"),
        ("ledger_spawn", "parallel_spawn", "ledger_child"),
    ):
        spawns = [{"agent": child, "prompt": f"Check station {i}: read every gauge and report."} for i in range(n)]
        (folder / f"{script}.yaml").write_text(
            json.dumps(
                {
                    "context_window": 4_000_000,
                    "turns": [
                        {"tool_call": {"name": tool, "arguments": {"spawns": spawns}}},
                        {"text": "All stations reported."},
                    ],
                }
            )
        )


def _agents(folder: Path, n: int, horizon: int) -> Any:
    from loomrt.spec_load import load_agents

    common = {
        "spawnable": ["child"],
        "max_concurrent_children": 8,
        "max_live_children": 32,
        "context": {"mode": "append", "budget_tokens": 4_000_000, "message_max_tokens": 2_000_000},
    }
    agents = {
        "state": {"model": "scripted/parallel_spawn.yaml", "tools": ["parallel_spawn"], **common},
        "transcript": {
            "model": "scripted/parallel_spawn_transcripts.yaml",
            "tools": ["parallel_spawn_transcripts"],
            **common,
        },
        "ledger": {
            "model": "scripted/ledger_spawn.yaml",
            "tools": ["parallel_spawn"],
            **common,
            "spawnable": ["ledger_child"],
        },
        "child": {
            "model": "scripted/child.yaml",
            "tools": ["calculate"],
            "max_iterations": horizon + 3,
            "context": {"mode": "stateful", "state_schema": SCHEMA, "budget_tokens": 4096},
        },
        "ledger_child": {
            "model": LEDGER,
            "tools": ["calculate"],
            "max_iterations": 2 * horizon + 3,  # a step the budget rejects is retried
            "context": {
                "mode": "stateful",
                "state_schema": LEDGER_SCHEMA,
                "budget_tokens": 4096,
                "stateful": {"state_max_tokens": LEDGER_SIGMA_TOKENS},
            },
        },
    }
    (folder / "agents.yaml").write_text(json.dumps({"agents": agents}))
    return load_agents(folder / "agents.yaml")


def _transcripts_tool(box: dict[str, Any]) -> Any:
    """``parallel_spawn_transcripts``: run the children and return their whole message logs."""
    from loomrt.events import message_of
    from loomrt.tools import Tool

    async def fn(spawns: list[dict[str, Any]]) -> dict[str, Any]:
        rt, agents = box["runtime"], box["agents"]
        slots = asyncio.Semaphore(8)

        async def one(entry: dict[str, Any]) -> dict[str, Any]:
            async with slots:
                result = await rt.run(entry["agent"], entry["prompt"], agents=agents)
            box["children"].append(result.run_id)
            log = [m.to_dict() for m in (message_of(e) for e in rt.store.events(result.run_id)) if m is not None]
            return {"run_id": result.run_id, "status": result.status, "transcript": log}

        return {"runs": list(await asyncio.gather(*(one(e) for e in spawns)))}

    schema = {"type": "object", "properties": {"spawns": {"type": "array"}}, "required": ["spawns"]}
    return Tool("parallel_spawn_transcripts", "Run children; return their transcripts.", schema, fn)


async def _one(n: int, horizon: int) -> dict[str, Any]:
    from loomrt.providers import resolve_provider
    from loomrt.providers.scripted import FunctionProvider
    from loomrt.record.sqlite import SQLiteStore
    from loomrt.runtime import Runtime
    from loomrt.tokens import count_messages, count_text

    def providers(spec: Any, model: str) -> Any:
        if model == LEDGER:
            return FunctionProvider(_ledger_reply(horizon), name=LEDGER)
        return resolve_provider(spec, model)

    out: dict[str, Any] = {"children": n, "horizon": horizon}
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        _scripts(folder, n, horizon)
        agents = _agents(folder, n, horizon)
        box: dict[str, Any] = {"agents": agents, "children": []}
        rt = Runtime(SQLiteStore(folder / "fanout.db"), providers=providers, tools=[_transcripts_tool(box)])
        box["runtime"] = rt
        for variant in ("state", "transcript", "ledger"):
            result = await rt.run(variant, "Check every station.", agents=agents)
            assert result.status == "done", result.error
            parent = await rt.aopen(result.run_id)
            total = rt.usage_of(result.run_id)["input_tokens"]
            if variant == "transcript":
                total += sum(rt.usage_of(c)["input_tokens"] for c in box["children"])
            out[f"{variant}_parent_tokens"] = count_messages(parent.context)
            if variant != "ledger":
                out[f"{variant}_total_input_tokens"] = total
            if variant != "transcript":  # the largest Σ row a child handed up
                children = [r.run_id for r in rt.store.list_runs() if r.parent_run_id == result.run_id]
                assert len(children) == n, children
                states = [(await rt.aopen(c)).state or {} for c in children]
                out[f"{variant}_row_tokens"] = max(count_text(json.dumps(st, ensure_ascii=False)) for st in states)
                if variant == "ledger":
                    out["ledger_findings_kept"] = min(len(st.get("findings", [])) for st in states)
        rt.store.close()
    out["parent_ratio"] = round(out["transcript_parent_tokens"] / max(1, out["state_parent_tokens"]), 1)
    out["total_ratio"] = round(out["transcript_total_input_tokens"] / max(1, out["state_total_input_tokens"]), 2)
    return out


def fanout_figures(
    ns: tuple[int, ...] = (1, 4, 16, 32), horizons: tuple[int, ...] = (20, 100), progress: Progress | None = None
) -> dict[str, Any]:
    """One row per (N, H): the parent's context and the total input tokens, both ways; the
    largest Σ row of each child kind. ``ledger``: whether the ledger rows stayed within the Σ
    budget at every H, and how much the largest grew from the shortest H to the longest."""
    rows = []
    for horizon in horizons:
        for n in ns:
            rows.append(asyncio.run(_one(n, horizon)))
            if progress is not None:
                progress.advance()
    by_h = {h: max(r["ledger_row_tokens"] for r in rows if r["horizon"] == h) for h in horizons}
    ledger = {
        "sigma_budget_tokens": LEDGER_SIGMA_TOKENS,
        "row_tokens_by_horizon": {str(h): t for h, t in by_h.items()},
        "within_budget": all(t <= LEDGER_SIGMA_TOKENS for t in by_h.values()),
        "growth": round(by_h[max(horizons)] / max(1, by_h[min(horizons)]), 2),
    }
    return {"rows": rows, "ledger": ledger}


@standalone_measure(
    "fanout", "N stateful children handing up Σ rows against transcripts: parent context and total tokens"
)
def fanout(config: BenchConfig, progress: Progress) -> dict[str, Any]:
    ns, horizons = ((1, 4), (20, 60)) if config.quick else ((1, 4, 16, 32), (20, 100))  # two H: growth shows
    progress.start("fanout", len(ns) * len(horizons))
    return fanout_figures(ns, horizons, progress)
