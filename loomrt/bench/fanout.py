"""The ``fanout`` measure: what N children cost their parent, Σ rows against transcripts.

A parent calls one fan-out of N stateful children, each working H steps (a tool call per
step) before it ends with its final Σ; then the parent answers. Two ways to hand the
results up, on the same children and scripts:

- **state**: loomrt's ``parallel_spawn``: one row per child carrying its final Σ;
- **transcript**: what a runtime without stateful hand-up does: the same children, run
  concurrently, and each child's whole message log returned to the parent.

Reported per (N, H): the parent's working context after the fan-out (tokens), and the total
input tokens of the parent and all children (a run's cost). The parent's window and message
limit are set out of reach, so neither variant is cut: loomrt would otherwise cut a
transcript at ``context.message_max_tokens`` (a quarter of the budget), which hides its size. The design fails if the state
rows grow with H, or cost about what transcripts cost.
"""

from __future__ import annotations

import asyncio
import json
import tempfile
from pathlib import Path
from typing import Any

from loomrt.bench.core import BenchConfig, Progress, standalone_measure

__all__ = ["fanout_figures", "fanout"]

SCHEMA = {"type": "object", "properties": {"step": {"type": "integer"}, "finding": {"type": "string"}}}


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
    for tool in ("parallel_spawn", "parallel_spawn_transcripts"):
        spawns = [{"agent": "child", "prompt": f"Check station {i}: read every gauge and report."} for i in range(n)]
        (folder / f"{tool}.yaml").write_text(
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
        "child": {
            "model": "scripted/child.yaml",
            "tools": ["calculate"],
            "max_iterations": horizon + 3,
            "context": {"mode": "stateful", "state_schema": SCHEMA, "budget_tokens": 4096},
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
    from loomrt.record.sqlite import SQLiteStore
    from loomrt.runtime import Runtime
    from loomrt.tokens import count_messages

    out: dict[str, Any] = {"children": n, "horizon": horizon}
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        _scripts(folder, n, horizon)
        agents = _agents(folder, n, horizon)
        box: dict[str, Any] = {"agents": agents, "children": []}
        rt = Runtime(SQLiteStore(folder / "fanout.db"), tools=[_transcripts_tool(box)])
        box["runtime"] = rt
        for variant in ("state", "transcript"):
            result = await rt.run(variant, "Check every station.", agents=agents)
            assert result.status == "done", result.error
            parent = await rt.aopen(result.run_id)
            total = rt.usage_of(result.run_id)["input_tokens"]
            if variant == "transcript":
                total += sum(rt.usage_of(c)["input_tokens"] for c in box["children"])
            out[f"{variant}_parent_tokens"] = count_messages(parent.context)
            out[f"{variant}_total_input_tokens"] = total
        rt.store.close()
    out["parent_ratio"] = round(out["transcript_parent_tokens"] / max(1, out["state_parent_tokens"]), 1)
    out["total_ratio"] = round(out["transcript_total_input_tokens"] / max(1, out["state_total_input_tokens"]), 2)
    return out


def fanout_figures(
    ns: tuple[int, ...] = (1, 4, 16, 32), horizons: tuple[int, ...] = (20, 100), progress: Progress | None = None
) -> dict[str, Any]:
    """One row per (N, H): the parent's context and the total input tokens, both ways."""
    rows = []
    for horizon in horizons:
        for n in ns:
            rows.append(asyncio.run(_one(n, horizon)))
            if progress is not None:
                progress.advance()
    return {"rows": rows}


@standalone_measure(
    "fanout", "N stateful children handing up Σ rows against transcripts: parent context and total tokens"
)
def fanout(config: BenchConfig, progress: Progress) -> dict[str, Any]:
    ns, horizons = ((1, 4), (20,)) if config.quick else ((1, 4, 16, 32), (20, 100))
    progress.start("fanout", len(ns) * len(horizons))
    return fanout_figures(ns, horizons, progress)
