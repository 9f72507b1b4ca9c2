"""The ``mcp`` measure: `loomrt mcp` driven by the SDK's real client over stdio, and an MCP
server used as a tool source.

- **Round trip**: ``spawn_run`` of an agent whose scripted model answers at once, many
  times: what the front door costs over a run (p50/p95 ms, from the client's side).
- **Fan-out**: ``spawn_runs`` of N runs whose model takes a fixed time each. If the server
  played them one after another the call would take N times that; the overlap ratio is the
  serial time over the wall time (N at best, 1 when nothing overlaps).
- **Tool source**: a run that calls a tool of a stdio MCP server K times against one that
  calls the built-in ``calculate`` K times: the extra milliseconds per call, and how long
  the server took to start on first use.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from loomrt.bench.core import BenchConfig, Progress, standalone_measure

__all__ = ["mcp_figures", "mcp_measure"]

DELAY_S = 0.5


def _write(folder: Path, calls: int) -> Path:
    (folder / "quick.yaml").write_text("turns:\n  - text: done\n", encoding="utf-8")
    (folder / "slow.yaml").write_text(f"turns:\n  - {{text: done, delay_s: {DELAY_S}}}\n", encoding="utf-8")
    (folder / "notes.txt").write_text("note 1: 10 litres\n", encoding="utf-8")
    for name, tool, args in [
        ("viamcp", "mcp__notes__add", "{numbers: [1, 2]}"),
        ("builtin", "calculate", "{expression: '1 + 2'}"),
    ]:
        turns = "".join(f"  - tool_call: {{name: {tool}, arguments: {args}}}\n" for _ in range(calls))
        (folder / f"{name}.yaml").write_text(f"turns:\n{turns}  - text: done\n", encoding="utf-8")
    server = (
        f"{{name: notes, command: '{sys.executable}', args: [-m, loomrt.bench.notes_server, '{folder / 'notes.txt'}']}}"
    )
    (folder / "agents.yaml").write_text(
        "agents:\n"
        "  quick: {model: scripted/quick.yaml}\n"
        "  slow: {model: scripted/slow.yaml}\n"
        f"  viamcp: {{model: scripted/viamcp.yaml, max_iterations: {calls + 2}, mcp_servers: [{server}], tools: [notes.add]}}\n"
        f"  builtin: {{model: scripted/builtin.yaml, max_iterations: {calls + 2}, tools: [calculate]}}\n",
        encoding="utf-8",
    )
    return folder / "agents.yaml"


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def _through_the_server(agents: Path, round_trips: int, fan_out: int) -> dict[str, Any]:
    from mcp.client.session import ClientSession
    from mcp.client.stdio import StdioServerParameters, stdio_client

    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "loomrt", "mcp", "--agents", str(agents)],
        env=dict(os.environ),
        cwd=str(agents.parent),
    )
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        await session.call_tool("spawn_run", {"agent": "quick", "prompt": "warm up"})
        times = []
        for i in range(round_trips):
            started = time.perf_counter()
            result = await session.call_tool("spawn_run", {"agent": "quick", "prompt": f"task {i}"})
            times.append((time.perf_counter() - started) * 1000)
            assert not result.is_error and result.structured_content["status"] == "done"
        started = time.perf_counter()
        rows = await session.call_tool(
            "spawn_runs", {"spawns": [{"agent": "slow", "prompt": f"p{i}"} for i in range(fan_out)]}
        )
        wall = time.perf_counter() - started
        ok = sum(1 for r in rows.structured_content["runs"] if r["ok"])
    return {
        "round_trips": round_trips,
        "spawn_run_p50_ms": round(statistics.median(times), 2),
        "spawn_run_p95_ms": round(_pct(times, 0.95), 2),
        "fan_out": fan_out,
        "fan_out_ok": ok,
        "model_s_each": DELAY_S,
        "fan_out_wall_s": round(wall, 3),
        "overlap": round(fan_out * DELAY_S / wall, 2),
    }


async def _tool_source(agents: Path, calls: int) -> dict[str, Any]:
    from loomrt.runtime import Runtime
    from loomrt.spec_load import load_agents

    defs = load_agents(agents)
    rt = Runtime()
    out: dict[str, float] = {}
    for name in ("builtin", "viamcp"):
        started = time.perf_counter()
        result = await rt.run(name, "go", agents=defs)
        out[name] = time.perf_counter() - started
        assert result.status == "done", result.error
        events = rt.store.events(result.run_id)
        asked = next(e.ts for e in events if e.kind == "user_input")
        out[f"{name}_first_answer_s"] = next(e.ts for e in events if e.kind == "model_call") - asked
        if name == "viamcp":  # the server starts before the first model call: it is asked for its tools
            calls_at = [e.ts for e in events if e.kind == "tool_call"]
            results_at = [e.ts for e in events if e.kind == "tool_result"]
            out["start_s"] = out["viamcp_first_answer_s"] - out["builtin_first_answer_s"]
            out["call_ms"] = statistics.median(r - c for c, r in zip(calls_at, results_at, strict=True)) * 1000
        else:
            out["builtin_call_ms"] = (
                statistics.median(
                    r.ts - c.ts
                    for c, r in zip(
                        [e for e in events if e.kind == "tool_call"],
                        [e for e in events if e.kind == "tool_result"],
                        strict=True,
                    )
                )
                * 1000
            )
    return {
        "tool_calls": calls,
        "server_start_s": round(out["start_s"], 3),
        "mcp_call_p50_ms": round(out["call_ms"], 2),
        "builtin_call_p50_ms": round(out["builtin_call_ms"], 3),
        "extra_ms_per_call": round(out["call_ms"] - out["builtin_call_ms"], 2),
    }


def mcp_figures(round_trips: int = 40, fan_out: int = 8, calls: int = 20) -> dict[str, Any]:
    """The figures of the ``mcp`` measure (see the module docstring)."""
    with tempfile.TemporaryDirectory() as tmp:
        home = os.environ.get("LOOMRT_HOME")
        os.environ["LOOMRT_HOME"] = str(Path(tmp) / "home")  # the server and this process share one record
        try:
            agents = _write(Path(tmp), calls)
            server = asyncio.run(_through_the_server(agents, round_trips, fan_out))
            source = asyncio.run(_tool_source(agents, calls))
        finally:
            if home is None:
                os.environ.pop("LOOMRT_HOME", None)
            else:
                os.environ["LOOMRT_HOME"] = home
    return {**server, **source}


@standalone_measure(
    "mcp", "loomrt mcp over stdio (spawn_run round trip, spawn_runs overlap) and an MCP tool source's cost per call"
)
def mcp_measure(config: BenchConfig, progress: Progress) -> dict[str, Any]:
    progress.start("mcp", 1)
    out = mcp_figures(*((10, 4, 5) if config.quick else (40, 8, 20)))
    progress.advance()
    return out
