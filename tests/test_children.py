"""Sub-agents: spawn and parallel_spawn, rows in order, all-or-none admission, the size cap,
stateful children handing up Σ, Σ reduce, the spawn ledger and a crash in a fan-out."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from loomrt.errors import SpecError
from loomrt.record.sqlite import default_store
from loomrt.runtime import Runtime
from loomrt.spec_load import load_agents, load_agents_text

SCHEMA = {"type": "object", "properties": {"step": {"type": "integer"}, "finding": {"type": "string"}}}
PARENT_SCHEMA = {"type": "object", "properties": {"results": {"type": "object"}, "step": {"type": "integer"}}}


def child_script(folder: Path, name: str, steps: int, finding: str = "the pump is fine") -> str:
    """A stateful child that works ``steps`` steps (each with a tool call) and ends with Σ."""
    turns = []
    for i in range(steps):
        turns.append(
            {
                "emit_state": {
                    "reasoning": f"step {i}",
                    "patch": {"step": i + 1},
                    "action": {"tool": "calculate", "arguments": {"expression": f"{i} + 1"}},
                }
            }
        )
    turns.append(
        {
            "emit_state": {
                "reasoning": "done",
                "patch": {"finding": finding},
                "done": True,
                "final": f"{finding} (long transcript elided)",
            }
        }
    )
    (folder / f"{name}.yaml").write_text(json.dumps({"turns": turns, "summaries": [{"extractive": 200}]}))
    return f"scripted/{name}.yaml"


def parent_script(folder: Path, name: str, spawns: list[dict[str, Any]], **call: Any) -> str:
    turns = [{"tool_call": {"name": "parallel_spawn", "arguments": {"spawns": spawns, **call}}}, {"text": "all done"}]
    (folder / f"{name}.yaml").write_text(json.dumps({"turns": turns}))
    return f"scripted/{name}.yaml"


def write_agents(folder: Path, agents: dict[str, Any]) -> Path:
    path = folder / "agents.yaml"
    path.write_text(json.dumps({"agents": agents}))
    return path


def tool_rows(run_id: str) -> list[dict[str, Any]]:
    (result,) = [e.data for e in default_store().events(run_id) if e.kind == "tool_result"]
    assert not result["is_error"], result["content"]
    return json.loads(result["content"])["runs"]


def stateful_child(folder: Path, name: str, steps: int, **kw: Any) -> dict[str, Any]:
    return {
        "model": child_script(folder, name, steps, **kw),
        "tools": ["calculate"],
        "max_iterations": steps + 3,
        "context": {"mode": "stateful", "state_schema": SCHEMA, "budget_tokens": 2048},
    }


def run(path: Path, agent: str = "boss", prompt: str = "fan out") -> Any:
    return Runtime().run_sync(agent, prompt, agents=load_agents(path), agents_file=str(path))


def test_parallel_spawn_rows_in_order_with_failures_timeouts_and_max_iterations(tmp_path: Path) -> None:
    (tmp_path / "plain.yaml").write_text("turns:\n  - text: a plain answer\n")
    (tmp_path / "slow.yaml").write_text("turns:\n  - {text: late, delay_s: 30}\n")
    (tmp_path / "loop.yaml").write_text(
        "turns:\n" + "  - tool_call: {name: calculate, arguments: {expression: '1'}}\n" * 3
    )
    (tmp_path / "broken.yaml").write_text("turns: []\n")
    spawns = [
        {"agent": "worker", "prompt": "check the pump"},
        {"agent": "plain", "prompt": "say something"},
        {"agent": "slow", "prompt": "take forever", "timeout_s": 0.5},
        {"agent": "looper", "prompt": "loop"},
        {"agent": "broken", "prompt": "fail"},
    ]
    path = write_agents(
        tmp_path,
        {
            "boss": {
                "model": parent_script(tmp_path, "boss", spawns),
                "tools": ["parallel_spawn"],
                "spawnable": ["worker", "plain", "slow", "looper", "broken"],
            },
            "worker": stateful_child(tmp_path, "worker", 2),
            "plain": {"model": "scripted/plain.yaml"},
            "slow": {"model": "scripted/slow.yaml"},
            "looper": {"model": "scripted/loop.yaml", "tools": ["calculate"], "max_iterations": 2},
            "broken": {"model": "scripted/broken.yaml"},
        },
    )
    result = run(path)
    assert (result.status, result.output) == ("done", "all done")
    rows = tool_rows(result.run_id)
    assert [r["index"] for r in rows] == [0, 1, 2, 3, 4]
    assert [r["status"] for r in rows] == ["ok", "ok", "timeout", "max_iterations", "failed"]
    assert rows[0]["state"] == {"step": 2, "finding": "the pump is fine"} and "output" not in rows[0]
    assert rows[1]["output"] == "a plain answer" and "state" not in rows[1]
    children = default_store().children(result.run_id)
    assert {c.run_id for c in children} == {r["run_id"] for r in rows}
    assert all(c.parent_run_id == result.run_id and c.root_run_id == result.run_id for c in children)
    slow = next(c for c in children if c.agent == "slow")
    assert slow.status == "cancelled"
    ledger = [e.kind for e in default_store().events(result.run_id) if e.kind.startswith("spawn_child")]
    assert ledger.count("spawn_child_started") == 5 and ledger.count("spawn_child_result") == 5


def test_a_bad_entry_refuses_the_whole_call_and_no_child_starts(tmp_path: Path) -> None:
    spawns = [
        {"agent": "worker", "prompt": "a"},
        {"agent": "worker", "prompt": "b", "context": {"budget_tokens": 99999}},
    ]
    path = write_agents(
        tmp_path,
        {
            "boss": {
                "model": parent_script(tmp_path, "boss", spawns),
                "tools": ["parallel_spawn"],
                "spawnable": ["worker"],
            },
            "worker": stateful_child(tmp_path, "worker", 1),
        },
    )
    result = run(path)
    (content,) = [e.data for e in default_store().events(result.run_id) if e.kind == "tool_result"]
    assert content["is_error"] and "spawns[1].context.budget_tokens" in content["content"]
    assert default_store().children(result.run_id) == []


def test_admission_is_all_or_none_against_max_live_children(tmp_path: Path) -> None:
    spawns = [{"agent": "worker", "prompt": str(i)} for i in range(3)]
    path = write_agents(
        tmp_path,
        {
            "boss": {
                "model": parent_script(tmp_path, "boss", spawns),
                "tools": ["parallel_spawn"],
                "spawnable": ["worker"],
                "max_live_children": 2,
            },
            "worker": stateful_child(tmp_path, "worker", 1),
        },
    )
    result = run(path)
    (content,) = [e.data for e in default_store().events(result.run_id) if e.kind == "tool_result"]
    assert content["is_error"] and "max_live_children" in content["content"]
    assert default_store().children(result.run_id) == []


def test_a_timeout_above_the_ceiling_is_refused_not_clamped(tmp_path: Path) -> None:
    spawns = [{"agent": "worker", "prompt": "x", "timeout_s": 100}]
    path = write_agents(
        tmp_path,
        {
            "boss": {
                "model": parent_script(tmp_path, "boss", spawns),
                "tools": ["parallel_spawn"],
                "spawnable": ["worker"],
                "max_child_timeout_s": 10,
            },
            "worker": stateful_child(tmp_path, "worker", 1),
        },
    )
    (content,) = [e.data for e in default_store().events(run(path).run_id) if e.kind == "tool_result"]
    assert content["is_error"] and "max_child_timeout_s" in content["content"]


@pytest.mark.parametrize("n", [1, 4, 32])
def test_fan_outs_of_1_4_and_32_stateful_children(tmp_path: Path, n: int) -> None:
    spawns = [{"agent": "worker", "prompt": f"task {i}"} for i in range(n)]
    path = write_agents(
        tmp_path,
        {
            "boss": {
                "model": parent_script(tmp_path, "boss", spawns),
                "tools": ["parallel_spawn"],
                "spawnable": ["worker"],
                "context": {"budget_tokens": 32768},
            },
            "worker": stateful_child(tmp_path, "worker", 2),
        },
    )
    rows = tool_rows(run(path).run_id)
    assert [r["index"] for r in rows] == list(range(n)) and all(r["ok"] for r in rows)
    assert len({r["run_id"] for r in rows}) == n


def test_a_state_too_big_for_its_share_is_omitted_whole(tmp_path: Path) -> None:
    spawns = [{"agent": "worker", "prompt": "x"}, {"agent": "worker", "prompt": "y"}]
    path = write_agents(
        tmp_path,
        {
            "boss": {
                "model": parent_script(tmp_path, "boss", spawns),
                "tools": ["parallel_spawn"],
                "spawnable": ["worker"],
                "context": {"budget_tokens": 512},
            },
            "worker": stateful_child(tmp_path, "worker", 1, finding="all systems nominal " * 60),
        },
    )
    result = run(path)
    rows = tool_rows(result.run_id)
    assert all(r["state_omitted"] and r["state_bytes"] > 1000 and "state" not in r for r in rows)
    full = [e.data for e in default_store().events(result.run_id) if e.kind == "spawn_child_result"]
    assert all(len(d["state"]["finding"]) > 1000 for d in full)  # the full result is recorded before any cut


@pytest.mark.parametrize("steps", [20, 100])
def test_the_parents_context_grows_by_one_row_per_stateful_child(tmp_path: Path, steps: int) -> None:
    spawns = [{"agent": "worker", "prompt": "investigate"}]
    path = write_agents(
        tmp_path,
        {
            "boss": {
                "model": parent_script(tmp_path, "boss", spawns),
                "tools": ["parallel_spawn"],
                "spawnable": ["worker"],
            },
            "worker": {**stateful_child(tmp_path, "worker", steps), "max_iterations": steps + 3},
        },
    )
    result = run(path)
    parent = Runtime().open(result.run_id)
    (row_message,) = [m for m in parent.context if m.role == "tool"]
    assert len(row_message.content) < 400  # one JSON row, whatever the child's horizon
    child = Runtime().open(tool_rows(result.run_id)[0]["run_id"])
    assert child.model_calls == steps + 1


def test_children_state_merges_each_childs_state_into_the_parents(tmp_path: Path) -> None:
    turns = [
        {
            "emit_state": {
                "reasoning": "fan out",
                "patch": {"step": 1},
                "action": {
                    "tool": "parallel_spawn",
                    "arguments": {"spawns": [{"agent": "north", "prompt": "n"}, {"agent": "south", "prompt": "s"}]},
                },
            }
        },
        {"emit_state": {"reasoning": "done", "patch": {"step": 2}, "done": True, "final": "merged"}},
    ]
    (tmp_path / "boss.yaml").write_text(json.dumps({"turns": turns}))
    path = write_agents(
        tmp_path,
        {
            "boss": {
                "model": "scripted/boss.yaml",
                "tools": ["parallel_spawn"],
                "spawnable": ["north", "south"],
                "children_state": {"into": "/results", "key": "agent"},
                "context": {"mode": "stateful", "state_schema": PARENT_SCHEMA},
            },
            "north": stateful_child(tmp_path, "north", 1, finding="north is dry"),
            "south": stateful_child(tmp_path, "south", 1, finding="south is wet"),
        },
    )
    result = run(path)
    assert result.state["results"] == {
        "north": {"step": 1, "finding": "north is dry"},
        "south": {"step": 1, "finding": "south is wet"},
    }
    assert result.state["step"] == 2


def test_runs_show_lists_children_and_rolls_up_their_usage(tmp_path: Path) -> None:
    from loomrt.run.summary import run_summary

    spawns = [{"agent": "worker", "prompt": str(i)} for i in range(2)]
    path = write_agents(
        tmp_path,
        {
            "boss": {
                "model": parent_script(tmp_path, "boss", spawns),
                "tools": ["parallel_spawn"],
                "spawnable": ["worker"],
            },
            "worker": stateful_child(tmp_path, "worker", 1),
        },
    )
    result = run(path)
    store = default_store()
    summary = run_summary(store.get_run(result.run_id), store.events(result.run_id), store)
    assert len(summary["children"]) == 2
    kids = sum(Runtime().usage_of(c)["input_tokens"] for c in summary["children"])
    assert summary["usage"]["children"]["input_tokens"] == kids > 0


@pytest.mark.parametrize(
    "text, message",
    [
        ("agents:\n  p:\n    model: scripted/x.yaml\n    tools: [spawn]\n    spawnable: [ghost]\n", r"spawnable\[0\]"),
        ("agents:\n  p:\n    model: scripted/x.yaml\n    tools: [spawn]\n", "need spawnable"),
        ("agents:\n  p:\n    model: scripted/x.yaml\n    children_state: {into: /r}\n", "needs context.state_schema"),
    ],
)
def test_spawn_keys_are_validated_at_load_time(text: str, message: str) -> None:
    with pytest.raises(SpecError, match=message):
        load_agents_text(text, filename="agents.yaml")


@pytest.mark.slow
def test_a_fan_out_killed_mid_way_resumes_without_rerunning_finished_children(tmp_path: Path) -> None:
    spawns = [{"agent": "worker", "prompt": f"task {i}"} for i in range(6)]
    path = write_agents(
        tmp_path,
        {
            "boss": {
                "model": parent_script(tmp_path, "boss", spawns),
                "tools": ["parallel_spawn"],
                "spawnable": ["worker"],
                "max_concurrent_children": 2,
                "context": {"budget_tokens": 16384},
            },
            "worker": stateful_child(tmp_path, "worker", 2),
        },
    )
    env = {**os.environ, "LOOMRT_CRASH_AT": "in_spawn:3"}
    killed = subprocess.run(
        [sys.executable, "-m", "loomrt", "run", "boss", "fan out", "--agents", str(path), "--json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert killed.returncode == -9, killed.stderr
    store = default_store()
    (parent,) = [r for r in store.list_runs() if r.agent == "boss"]
    finished = {e.data["run_id"]: e.data["state"] for e in store.events(parent.run_id, kinds=["spawn_child_result"])}
    assert len(finished) == 3
    resumed = subprocess.run(
        [sys.executable, "-m", "loomrt", "runs", "resume", parent.run_id, "--json"],
        env=dict(os.environ),
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert resumed.returncode == 0, resumed.stderr
    assert json.loads(resumed.stdout)["status"] == "done"
    rows = tool_rows(parent.run_id)
    assert [r["index"] for r in rows] == list(range(6)) and all(r["ok"] for r in rows)
    children = store.children(parent.run_id)
    assert len(children) == 6  # none started twice
    for child in children:
        kinds = [e.kind for e in store.events(child.run_id)]
        assert kinds.count("run_started") == 1 and kinds.count("final") == 1
    for run_id, state in finished.items():  # finished children were not re-run: their Σ is as it was
        assert next(r for r in rows if r["run_id"] == run_id)["state"] == state
        assert [e.kind for e in store.events(run_id)].count("resumed") == 0


def test_the_docs_fan_out_prints_what_the_page_says() -> None:
    repo = Path(__file__).resolve().parent.parent
    page = (repo / "docs" / "subagents.md").read_text(encoding="utf-8")
    claimed = json.loads(page.split("```json\n", 1)[1].split("```", 1)[0])
    path = repo / "agents.yaml"
    result = Runtime().run_sync("demo-fanout", "Check the stations.", agents=load_agents(path), agents_file=str(path))
    assert {k: result.to_json()[k] for k in claimed} == claimed


def test_spawns_nest_at_most_three_deep(tmp_path: Path) -> None:
    agents: dict[str, Any] = {}
    names = ["l0", "l1", "l2", "l3", "l4"]
    for here, below in zip(names, names[1:], strict=False):
        (tmp_path / f"{here}.yaml").write_text(
            json.dumps(
                {
                    "turns": [
                        {"tool_call": {"name": "spawn", "arguments": {"agent": below, "prompt": "go down"}}},
                        {"text": f"{here} done"},
                    ]
                }
            )
        )
        agents[here] = {"model": f"scripted/{here}.yaml", "tools": ["spawn"], "spawnable": [below]}
    (tmp_path / "l4.yaml").write_text("turns:\n  - text: bottom\n")
    agents["l4"] = {"model": "scripted/l4.yaml"}
    path = write_agents(tmp_path, agents)
    top = run(path, "l0")
    store = default_store()
    depth = {r.agent: store.events(r.run_id)[0].data.get("depth", 0) for r in store.list_runs()}
    assert depth == {"l0": 0, "l1": 1, "l2": 2, "l3": 3}  # l3 (depth 3) may not spawn l4
    (l3,) = [r for r in store.list_runs() if r.agent == "l3"]
    (refused,) = [e.data for e in store.events(l3.run_id) if e.kind == "tool_result"]
    assert refused["is_error"] and "at most 3 deep" in refused["content"]
    assert all(r.root_run_id == top.run_id for r in store.list_runs() if r.agent != "l0")


def test_cancelling_the_parent_cancels_its_children(tmp_path: Path) -> None:
    from loomrt.mcp.service import RunService

    (tmp_path / "hang.yaml").write_text("turns:\n  - {text: late, delay_s: 60}\n")
    spawns = [{"agent": "hang", "prompt": str(i)} for i in range(3)]
    path = write_agents(
        tmp_path,
        {
            "boss": {
                "model": parent_script(tmp_path, "boss", spawns),
                "tools": ["parallel_spawn"],
                "spawnable": ["hang"],
            },
            "hang": {"model": "scripted/hang.yaml"},
        },
    )
    service = RunService(load_agents(path), agents_file=str(path))

    async def scenario() -> str:
        parent = await service.spawn("boss", "fan out")
        for _ in range(100):
            if len(default_store().children(parent.run_id)) == 3:
                break
            await asyncio.sleep(0.05)
        assert (await service.cancel(parent.run_id))["status"] == "cancelled"
        return parent.run_id

    parent_id = asyncio.run(scenario())
    children = default_store().children(parent_id)
    assert len(children) == 3 and all(c.status == "cancelled" for c in children)
    reasons = {e.data["reason"] for c in children for e in default_store().events(c.run_id) if e.kind == "cancelled"}
    assert reasons == {"its parent run was cancelled"}


def test_children_queue_behind_max_concurrent_and_queued_time_is_not_theirs(tmp_path: Path) -> None:
    (tmp_path / "nap.yaml").write_text("turns:\n  - {text: rested, delay_s: 0.4}\n")
    spawns = [{"agent": "napper", "prompt": str(i), "timeout_s": 0.7} for i in range(4)]
    path = write_agents(
        tmp_path,
        {
            "boss": {
                "model": parent_script(tmp_path, "boss", spawns),
                "tools": ["parallel_spawn"],
                "spawnable": ["napper"],
                "max_concurrent_children": 2,
            },
            "napper": {"model": "scripted/nap.yaml"},
        },
    )
    result = run(path)
    rows = tool_rows(result.run_id)
    assert all(r["ok"] for r in rows), rows  # the last two waited 0.4 s in the queue, inside their 0.7 s: not counted
    store = default_store()
    spans = [(store.events(c.run_id)[0].ts, store.events(c.run_id)[-1].ts) for c in store.children(result.run_id)]
    most = max(sum(1 for s, e in spans if s <= t < e) for t, _ in spans)
    assert most == 2  # never more than max_concurrent_children playing at once
